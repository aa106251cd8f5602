"""Where things live (pkb_mcp/config.py): launch directories follow their setting, and its former name."""

from pkb_mcp import config


def test_launch_directories_follow_the_setting_and_its_former_name(tmp_path, monkeypatch):
    monkeypatch.delenv("PKB_LAUNCH_DIR", raising=False)
    monkeypatch.setenv("PKB_JOBS_DIR", str(tmp_path / "old"))
    assert config.launches_dir() == tmp_path / "old" and (tmp_path / "old").is_dir()
    monkeypatch.setenv("PKB_LAUNCH_DIR", str(tmp_path / "new"))
    assert config.launches_dir() == tmp_path / "new", "the current name wins"
