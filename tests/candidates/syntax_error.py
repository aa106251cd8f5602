def solution(x):
    return x +
