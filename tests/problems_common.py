"""What the per-problem tests share: a problem by id, its inputs built on CPU in this process, and the
original benchmark's call of every problem whose tests pin it (../shared/pkb-contracts.md: the
signature of its reference file and the tuple its input builder passes), which one table-driven test
in tests/test_problems.py holds both variants of each problem to."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from pkb_mcp import problems

REQUIRED = inspect.Parameter.empty  # a parameter without a default


@dataclass(frozen=True)
class Kind:
    """A value of the call that varies by draw or world size, held to its kind only."""

    name: str

    def holds(self, value: Any) -> bool:
        if self.name == "tensor":
            return isinstance(value, torch.Tensor)
        if self.name == "ints":
            return isinstance(value, list) and all(type(x) is int for x in value)
        if self.name == "linear":
            return isinstance(value, torch.nn.Linear)
        return type(value) is {"int": int, "float": float, "size": torch.Size}[self.name]


TENSOR, INTS, INT, FLOAT, SIZE, LINEAR = (
    Kind(k) for k in ("tensor", "ints", "int", "float", "size", "linear")
)


@dataclass(frozen=True)
class Call:
    """How the original calls a problem's `solution`, at one world size its builder allows."""

    world_size: int
    params: list[tuple[str, Any]]  # (name, default), in order
    values: list[Any]  # each a Kind, or the constant the builder passes


def problem(pid: int, variant: str = "pkb") -> problems.Problem:
    return problems.suite(variant)[pid]


def cpu_inputs(
    pid: int,
    world_size: int,
    rank: int = 0,
    seed: int = 1,
    *,
    variant: str = "pkb",
    preset: str = "pkb",
    size: dict | None = None,
) -> tuple:
    """One rank's inputs of one trial, built on CPU in this process (`size`: entries that replace the
    preset's)."""
    p = problem(pid, variant)
    ctx = p.context(world_size, preset, rank=rank, device="cpu")
    ctx.size = {**ctx.size, **(size or {})}
    ctx.seed = seed
    return tuple(p.module.make_inputs(ctx))


def rank_inputs(pid: int, world_size: int, seed: int = 1, **options: Any) -> list[tuple]:
    """Every rank's inputs of one trial."""
    return [cpu_inputs(pid, world_size, rank, seed, **options) for rank in range(world_size)]


CALLS: dict[int, Call] = {  # by problem id
    24: Call(
        2,
        [("gate_logits", REQUIRED), ("num_experts", REQUIRED), ("top_k", 2), ("attention_mask", None)],
        [TENSOR, 8, 2, None],
    ),
    25: Call(
        4,
        [
            ("hidden_states", REQUIRED),
            ("weight", REQUIRED),
            ("labels", REQUIRED),
            ("old_logprobs", REQUIRED),
            ("advantages", REQUIRED),
            ("ignore_index", -100),
        ],
        [TENSOR, TENSOR, TENSOR, TENSOR, TENSOR, -100],
    ),
    26: Call(2, [("expert_mask", REQUIRED), ("num_experts", REQUIRED), ("group", None)], [TENSOR, 8, None]),
    27: Call(
        4,
        [
            ("local_tensor", REQUIRED),
            ("input_split_sizes", None),
            ("output_split_sizes", None),
            ("group", None),
        ],
        [TENSOR, INTS, INTS, None],
    ),
    28: Call(
        4,
        [
            ("hidden_states", REQUIRED),
            ("expert_mask", REQUIRED),
            ("num_experts", REQUIRED),
            ("input_splits", REQUIRED),
            ("output_splits", REQUIRED),
            ("num_global_tokens_per_local_expert", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, 8, INTS, INTS, TENSOR, None],
    ),
    29: Call(
        4,
        [
            ("expert_outputs", REQUIRED),
            ("routing_weights", REQUIRED),
            ("selected_experts", REQUIRED),
            ("num_experts", REQUIRED),
            ("input_splits", REQUIRED),
            ("output_splits", REQUIRED),
            ("num_global_tokens_per_local_expert", REQUIRED),
            ("routing_map", REQUIRED),
            ("local_input_permutation_mapping", REQUIRED),
            ("org_hidden_states_shape", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, 8, INTS, INTS, TENSOR, TENSOR, TENSOR, SIZE, None],
    ),
    30: Call(
        2,
        [
            ("grad_fc1_1_lora_A", REQUIRED),
            ("grad_fc1_2_lora_A", REQUIRED),
            ("grad_fc2_lora_B", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, None],
    ),
    31: Call(
        4,
        [
            ("hidden_states", REQUIRED),
            ("gate_weight", REQUIRED),
            ("gate_bias", REQUIRED),
            ("gate_proj", REQUIRED),
            ("up_proj", REQUIRED),
            ("down_proj", REQUIRED),
            ("num_experts", REQUIRED),
            ("top_k", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, LINEAR, LINEAR, LINEAR, 8, 2, None],
    ),
    32: Call(
        4,
        [
            ("hidden_states", REQUIRED),
            ("gate_weight", REQUIRED),
            ("gate_bias", REQUIRED),
            ("gate_proj", REQUIRED),
            ("up_proj", REQUIRED),
            ("down_proj", REQUIRED),
            ("lora_gate_A", REQUIRED),
            ("lora_gate_B", REQUIRED),
            ("lora_up_A", REQUIRED),
            ("lora_up_B", REQUIRED),
            ("lora_down_A", REQUIRED),
            ("lora_down_B", REQUIRED),
            ("num_experts", REQUIRED),
            ("top_k", REQUIRED),
            ("group", None),
        ],
        [
            TENSOR,
            TENSOR,
            TENSOR,
            LINEAR,
            LINEAR,
            LINEAR,
            TENSOR,
            TENSOR,
            TENSOR,
            TENSOR,
            TENSOR,
            TENSOR,
            8,
            2,
            None,
        ],
    ),
    33: Call(
        2,
        [("x", REQUIRED), ("scatter_dim", REQUIRED), ("gather_dim", REQUIRED), ("group", None)],
        [TENSOR, 0, 1, None],
    ),
    34: Call(2, [("x", REQUIRED), ("group", None)], [TENSOR, None]),
    35: Call(2, [("x", REQUIRED), ("gather_dim", REQUIRED), ("group", None)], [TENSOR, 0, None]),
    36: Call(
        2,
        [
            ("x", REQUIRED),
            ("seq_dim", REQUIRED),
            ("head_dim", REQUIRED),
            ("group", None),
            ("unpadded_dim_size", 0),
        ],
        [TENSOR, 1, 2, None, 0],
    ),
    37: Call(
        2,
        [("x", REQUIRED), ("seq_dim", REQUIRED), ("head_dim", REQUIRED), ("group", None)],
        [TENSOR, 1, 2, None],
    ),
    38: Call(
        8,
        [
            ("qkv_tensor", REQUIRED),
            ("seq_dim", REQUIRED),
            ("group", None),
            ("unpadded_dim_size", None),
            ("restore_shape", True),
        ],
        [TENSOR, 1, None, None, True],
    ),
    39: Call(
        8,
        [
            ("hidden_states", REQUIRED),
            ("w_qkv", REQUIRED),
            ("w_o", REQUIRED),
            ("group", None),
            ("num_heads", 8),
            ("causal", False),
        ],
        [TENSOR, TENSOR, TENSOR, None, 8, False],
    ),
    49: Call(
        4,
        [
            ("hidden_states", REQUIRED),
            ("gate_weight", REQUIRED),
            ("gate_bias", REQUIRED),
            ("gate_proj", REQUIRED),
            ("up_proj", REQUIRED),
            ("down_proj", REQUIRED),
            ("num_experts", REQUIRED),
            ("top_k", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, LINEAR, LINEAR, LINEAR, 4, 2, None],
    ),
    50: Call(
        4,
        [
            ("hidden_states", REQUIRED),
            ("gate_weight", REQUIRED),
            ("gate_bias", REQUIRED),
            ("gate_proj", REQUIRED),
            ("up_proj", REQUIRED),
            ("down_proj", REQUIRED),
            ("num_experts", REQUIRED),
            ("top_k", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, LINEAR, LINEAR, LINEAR, 8, 2, None],
    ),
    51: Call(
        4,
        [
            ("hidden_states", REQUIRED),
            ("gate_weight", REQUIRED),
            ("gate_bias", REQUIRED),
            ("gate_proj", REQUIRED),
            ("up_proj", REQUIRED),
            ("down_proj", REQUIRED),
            ("num_experts", REQUIRED),
            ("top_k", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, LINEAR, LINEAR, LINEAR, 2, 2, None],
    ),
    54: Call(
        2,
        [
            ("q", REQUIRED),
            ("k", REQUIRED),
            ("v", REQUIRED),
            ("softmax_scale", None),
            ("causal", False),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, None, True, None],
    ),
    58: Call(
        2,
        [
            ("image_features", REQUIRED),
            ("text_features", REQUIRED),
            ("logit_scale", REQUIRED),
            ("logit_bias", 0.0),
            ("group", None),
        ],
        [TENSOR, TENSOR, FLOAT, FLOAT, None],
    ),
    59: Call(
        8,
        [("x", REQUIRED), ("s", REQUIRED), ("dim", REQUIRED), ("norm", "ortho"), ("group", None)],
        [TENSOR, (1024, 1024), (1, 2), "ortho", None],
    ),
    60: Call(
        8,
        [("x", REQUIRED), ("s", REQUIRED), ("dim", REQUIRED), ("norm", "ortho"), ("group", None)],
        [TENSOR, (720, 1440), (-2, -1), "ortho", None],
    ),
    61: Call(
        8,
        [
            ("means", REQUIRED),
            ("quats", REQUIRED),
            ("scales", REQUIRED),
            ("opacities", REQUIRED),
            ("colors", REQUIRED),
            ("viewmats", REQUIRED),
            ("Ks", REQUIRED),
            ("image_width", REQUIRED),
            ("image_height", REQUIRED),
            ("eps2d", 0.3),
            ("near_plane", 0.01),
            ("far_plane", 10000000000.0),
            ("camera_model", "pinhole"),
        ],
        [
            TENSOR,
            TENSOR,
            TENSOR,
            TENSOR,
            TENSOR,
            TENSOR,
            TENSOR,
            512,
            512,
            0.3,
            0.01,
            10000000000.0,
            "pinhole",
        ],
    ),
    64: Call(
        4,
        [
            ("seed_nodes", REQUIRED),
            ("fanouts", REQUIRED),
            ("local_adj_row_ptr", REQUIRED),
            ("local_adj_col", REQUIRED),
            ("node_to_rank", REQUIRED),
            ("group", None),
            ("replace", False),
        ],
        [TENSOR, [10, 5], TENSOR, TENSOR, TENSOR, None, False],
    ),
    65: Call(
        8,
        [
            ("local_features", REQUIRED),
            ("seed_inverse_ids", REQUIRED),
            ("counts_sent", REQUIRED),
            ("counts_received", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, INTS, INTS, None],
    ),
    66: Call(
        8,
        [
            ("grad_output", REQUIRED),
            ("seed_inverse_ids", REQUIRED),
            ("seed_size", REQUIRED),
            ("counts_sent", REQUIRED),
            ("counts_received", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, 512, INTS, INTS, None],
    ),
    67: Call(
        4,
        [("idx", REQUIRED), ("value", REQUIRED), ("num_nodes", REQUIRED), ("group", None)],
        [TENSOR, TENSOR, 100000, None],
    ),
    68: Call(
        4,
        [
            ("local_embedding_shard", REQUIRED),
            ("input_node_ids", REQUIRED),
            ("proj_matrix", REQUIRED),
            ("num_total_nodes", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, INT, None],
    ),
    69: Call(
        8,
        [("local_pos_scores", REQUIRED), ("local_neg_scores", REQUIRED), ("group", None)],
        [TENSOR, TENSOR, None],
    ),
    70: Call(
        4,
        [
            ("lengths", REQUIRED),
            ("values", REQUIRED),
            ("key_splits", REQUIRED),
            ("batch_size", REQUIRED),
            ("pg", None),
            ("weights", None),
            ("stride_per_key", None),
            ("stagger", 1),
        ],
        [TENSOR, TENSOR, INTS, 512, None],
    ),
    71: Call(2, [("x", REQUIRED), ("weight", REQUIRED), ("group", None)], [TENSOR, TENSOR, None]),
    72: Call(
        8,
        [
            ("x1_seq", REQUIRED),
            ("x2_seq", REQUIRED),
            ("v_seq", REQUIRED),
            ("h", REQUIRED),
            ("conv_bias", REQUIRED),
            ("num_groups", REQUIRED),
            ("group_dim", REQUIRED),
            ("group", None),
            ("with_zigzag_splitting", True),
        ],
        [TENSOR, TENSOR, TENSOR, TENSOR, TENSOR, 1024, 1, None, True],
    ),
    75: Call(
        2,
        [
            ("q", REQUIRED),
            ("k", REQUIRED),
            ("v", REQUIRED),
            ("gate", REQUIRED),
            ("beta", REQUIRED),
            ("a_log", REQUIRED),
            ("dt_bias", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, TENSOR, TENSOR, TENSOR, TENSOR, None],
    ),
    76: Call(
        8,
        [
            ("input", REQUIRED),
            ("weight", REQUIRED),
            ("bias", REQUIRED),
            ("stride", REQUIRED),
            ("padding", REQUIRED),
            ("dilation", REQUIRED),
            ("groups", 1),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, 1, 0, 1, 1, None],
    ),
    77: Call(
        2,
        [
            ("query", REQUIRED),
            ("key_value", REQUIRED),
            ("k_ranges", REQUIRED),
            ("cp_shuffle_num", REQUIRED),
            ("clip_token_nums", None),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, 4, INT, None],
    ),
    78: Call(
        4,
        [
            ("z", REQUIRED),
            ("tile_latent_min_length", REQUIRED),
            ("tile_latent_min_height", REQUIRED),
            ("tile_latent_min_width", REQUIRED),
            ("spatial_tile_overlap_factor", REQUIRED),
            ("temporal_tile_overlap_factor", REQUIRED),
            ("spatial_upsample", REQUIRED),
            ("temporal_upsample", REQUIRED),
            ("sr_ratio", 1),
            ("first_frame_as_image", False),
            ("group", None),
        ],
        [TENSOR, 3, 32, 32, 0.25, 0.0, 8, 4, 1, False, None],
    ),
    79: Call(
        4,
        [
            ("test_features_rank", REQUIRED),
            ("train_features_rank_T", REQUIRED),
            ("train_labels_rank", REQUIRED),
            ("max_k", REQUIRED),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, 200, None],
    ),
    80: Call(
        2,
        [
            ("teacher_output", REQUIRED),
            ("teacher_temp", REQUIRED),
            ("n_masked_patches_tensor", REQUIRED),
            ("n_iterations", 3),
            ("group", None),
        ],
        [TENSOR, FLOAT, TENSOR, 3, None],
    ),
    81: Call(
        4,
        [
            ("low_res_masks_local", REQUIRED),
            ("obj_scores_local", REQUIRED),
            ("num_obj_per_gpu", REQUIRED),
            ("last_occluded", REQUIRED),
            ("iou_threshold", 0.7),
            ("reverse", False),
            ("group", None),
        ],
        [TENSOR, TENSOR, INTS, TENSOR, 0.7, False, None],
    ),
    82: Call(
        2,
        [
            ("vocab_parallel_logits", REQUIRED),
            ("target", REQUIRED),
            ("tp_group", None),
            ("top_k", None),
            ("top_p", 1.0),
        ],
        [TENSOR, TENSOR, None, INT, FLOAT],
    ),
    83: Call(
        2,
        [
            ("vocab_parallel_logits", REQUIRED),
            ("target", REQUIRED),
            ("tp_group", None),
            ("top_k", None),
            ("top_p", 1.0),
            ("chunk_size", 1),
        ],
        [TENSOR, TENSOR, None, INT, FLOAT, INT],
    ),
    84: Call(
        2,
        [
            ("vocab_parallel_logits", REQUIRED),
            ("target", REQUIRED),
            ("grad_output", REQUIRED),
            ("tp_group", None),
            ("top_k", None),
            ("top_p", 1.0),
            ("chunk_size", 1),
        ],
        [TENSOR, TENSOR, TENSOR, None, INT, FLOAT, INT],
    ),
    85: Call(4, [("local_shard", REQUIRED), ("group", None)], [TENSOR, None]),
    87: Call(
        8,
        [
            ("x", REQUIRED),
            ("weight", REQUIRED),
            ("bias", REQUIRED),
            ("stride", 1),
            ("padding", 1),
            ("group", None),
        ],
        [TENSOR, TENSOR, TENSOR, 1, 1, None],
    ),
}
