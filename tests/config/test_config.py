"""MonitorConfig: loading, aliases, and a clear error for every bad value."""

import pytest

from msmon_nb.config import ConfigError, MonitorConfig, check_tag, run_name_from

BAD = [
    # (field named in the message, the bad input)
    ("log_intervall", {"log_intervall": 10}),
    ("log_interval", {"log_interval": 0}),
    ("log_interval", {"log_interval": -5}),
    ("log_interval", {"log_interval": 2.5}),
    ("log_interval", {"log_interval": "10"}),
    ("log_interval", {"log_interval": True}),
    ("step_interval", {"step_interval": 0}),
    ("track_metrics", {"track_metrics": ["loss", "gradnorm"]}),
    ("track_metrics", {"track_metrics": ["loss", "Val/F1"]}),
    ("track_metrics", {"track_metrics": ["val/f 1"]}),
    ("track_metrics", {"track_metrics": ["val/f1@top5"]}),
    ("track_metrics", {"track_metrics": ["val/精度"]}),
    ("track_metrics", {"track_metrics": "loss"}),
    ("track_metrics", {"track_metrics": [3]}),
    ("monitor_type", {"monitor_type": "mindinsigt"}),
    ("monitor_type", {"monitor_type": "wandb"}),
    ("monitor_type", {"monitor_type": []}),
    ("save_dir", {"save_dir": "./训练日志"}),
    ("save_dir", {"save_dir": "./my runs"}),
    ("save_dir", {"save_dir": "./runs\t2"}),
    ("save_dir", {"save_dir": ""}),
    ("save_dir", {"save_dir": 5}),
    ("run_name", {"run_name": "my run"}),
    ("run_name", {"run_name": "a/b"}),
    ("run_name", {"run_name": "运行"}),
    ("project_name", {"project_name": "proj@x"}),
    ("model_name", {"model_name": "gpt 2"}),
    ("enable_monitor", {"enable_monitor": "yes"}),
    ("verbose", {"verbose": 1}),
    ("use_callback", {"use_callback": None}),
    ("batch_size", {"batch_size": 0}),
    ("batch_size", {"batch_size": "64"}),
    ("max_file_size", {"max_file_size": 100}),
    ("flush_secs", {"flush_secs": 5}),
    ("flush_secs", {"flush_secs": 0}),
    ("param_targets", {"param_targets": ["fc(["]}),
    ("param_targets", {"param_targets": "fc.*"}),
    ("param_stat_kinds", {"param_stat_kinds": ["max"]}),
    ("param_stat_kinds", {"param_stat_kinds": "max_abs"}),
    ("param_stat_kinds", {"param_stat_kinds": []}),
    ("param_stat_kinds", {"param_stat_kinds": ["norm", "norm"]}),
    ("module_targets", {"module_targets": ["fc(["]}),
    ("module_targets", {"module_targets": "fc"}),
    ("module_targets", {"module_targets": []}),
    ("attention_targets", {"attention_targets": ["attn(["]}),
    ("attention_targets", {"attention_targets": "attn"}),
    ("attention_targets", {"attention_targets": []}),
    ("stable_rank_every", {"stable_rank_every": 0}),
    ("stable_rank_every", {"stable_rank_every": True}),
    ("stable_rank_every", {"stable_rank_every": 2.0}),
    ("stable_rank_targets", {"stable_rank_targets": "fc"}),
    ("stable_rank_targets", {"stable_rank_targets": []}),
    ("stable_rank_targets", {"stable_rank_targets": ["fc(["]}),
    ("alerts", {"alerts": ["explosion"]}),
    ("snapshot", {"snapshot": "alert"}),
    ("break_on", {"break_on": 5}),
    ("monitor_config", {"monitor_config": ["log_interval"]}),
    ("log_interval", {"log_interval": 1, "step_interval": 2}),
]


@pytest.mark.parametrize(("field", "data"), BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_bad_value_names_field(field, data):
    with pytest.raises(ConfigError) as info:
        MonitorConfig.from_dict(data)
    message = str(info.value)
    assert field in message
    assert len(message) > 30


def test_stat_kinds_and_module_targets_say_the_fix():
    with pytest.raises(ConfigError, match=r"did you mean 'max_abs'.*known: norm, max_abs"):
        MonitorConfig(param_stat_kinds=["max"])
    cfg = MonitorConfig(
        track_metrics=["loss", "activations", "act_grad"],
        param_stat_kinds=["norm", "zero_frac"],
        module_targets=["^fc"],
    )
    assert cfg.tracks("activations") and cfg.tracks("act_grad")
    assert MonitorConfig().param_stat_kinds == ["norm"] and MonitorConfig().module_targets is None
    assert MonitorConfig(attention_targets=[r"\.attn$"]).attention_targets == [r"\.attn$"]
    with pytest.raises(ConfigError, match=r"attention_targets.*list of regexes"):
        MonitorConfig(attention_targets="attn")


def test_stable_rank_targets_default_to_param_targets():
    cfg = MonitorConfig(track_metrics=["loss", "stable_rank"], param_targets=["^fc"])
    assert cfg.tracks("stable_rank") and cfg.stable_rank_every == 100
    assert cfg.stable_rank_selection == ["^fc"]
    assert cfg.replace(stable_rank_targets=["attn"]).stable_rank_selection == ["attn"]


def test_at_least_thirty_bad_cases():
    assert len(BAD) >= 30


def test_unknown_field_suggests_closest():
    with pytest.raises(ConfigError, match="did you mean 'log_interval'"):
        MonitorConfig.from_dict({"log_intervall": 10})


def test_bad_tag_message_gives_rule_and_valid_spelling():
    with pytest.raises(ConfigError) as info:
        check_tag("Val/F1 Score")
    assert "lowercase ASCII" in str(info.value)
    assert "'val/f1_score'" in str(info.value)


def test_bad_value_error_shows_the_value_and_an_example():
    with pytest.raises(ConfigError) as info:
        MonitorConfig(log_interval=0)
    assert "log_interval=0" in str(info.value) and "for example" in str(info.value)


def test_defaults_are_valid():
    cfg = MonitorConfig()
    assert cfg.log_interval == 1
    assert cfg.sink_types == ["summary"]
    assert {"loss", "grad_norm", "learning_rate", "throughput"} <= set(cfg.track_metrics)


def test_yaml_top_level_and_nested(tmp_path):
    top = tmp_path / "top.yaml"
    top.write_text("log_interval: 10\nsave_dir: ./runs\ntrack_metrics: [loss, grad_norm]\n")
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "model: {type: gpt2}\n"
        "monitor_config:\n"
        "  enable_monitor: True\n"
        "  monitor_type: mindinsight\n"
        "  project_name: gpt2_medium_finetune\n"
        "  run_name: run_20240816_1430\n"
        "  log_interval: 10\n"
        "  track_metrics: [loss, grad_norm, learning_rate, throughput]\n"
        "  save_dir: ./monitor_logs\n"
        "  use_callback: True\n"
        "  verbose: True\n"
    )
    a = MonitorConfig.from_yaml(top)
    b = MonitorConfig.from_yaml(nested)
    assert a.log_interval == 10 and a.save_dir == "./runs"
    assert b.sink_types == ["summary"]  # mindinsight is the summary format
    assert b.run_name == "run_20240816_1430" and b.verbose is True


def test_yaml_snapshot_on_key_is_not_a_boolean(tmp_path):
    # YAML 1.1 reads `on` as true: the guide's `snapshot: {on: alert, keep: 20}` (and our
    # error messages' example) failed to load as "snapshot.True: unknown key"
    path = tmp_path / "monitor.yaml"
    path.write_text("monitor_config:\n  snapshot: {on: alert, keep: 20}\n")
    assert MonitorConfig.from_yaml(path).snapshot == {"on": "alert", "keep": 20}
    with pytest.raises(ConfigError, match=r"snapshot\.on"):
        MonitorConfig.from_dict({"snapshot": {True: "sometimes"}})


def test_mindformers_aliases():
    cfg = MonitorConfig.from_dict(
        {"monitor_on": True, "dump_path": "./dump", "step_interval": 5, "target": ["fc.*"]}
    )
    assert (cfg.enable_monitor, cfg.save_dir, cfg.log_interval) == (True, "./dump", 5)
    assert cfg.param_targets == ["fc.*"]


def test_yaml_errors_are_config_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("log_interval: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        MonitorConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        MonitorConfig.from_yaml(tmp_path / "missing.yaml")


def test_custom_tags_allowed_in_track_metrics():
    cfg = MonitorConfig(track_metrics=["loss", "val/f1", "train/tokens_per_s"])
    assert cfg.tracks("val/f1")


def test_run_name_from_is_a_stable_short_hash():
    a = run_name_from({"lr": 0.1, "bs": 64}, model="mlp")
    b = run_name_from({"bs": 64, "lr": 0.1}, model="mlp")
    c = run_name_from({"bs": 64, "lr": 0.2}, model="mlp")
    assert a == b != c
    assert a.startswith("mlp_") and len(a) == len("mlp_") + 8


def test_replace_validates():
    cfg = MonitorConfig()
    assert cfg.replace(step_interval=7).log_interval == 7
    with pytest.raises(ConfigError, match="log_interval"):
        cfg.replace(log_interval=-1)


@pytest.mark.parametrize(
    "names",
    [["optD"], {"optD": "Critic"}, {"optD": "a/b"}, {"optD": ""}, {"optD": 3}, {3: "x"}],
)
def test_optimizer_names_must_map_variables_to_one_tag_group(names):
    with pytest.raises(ConfigError, match="optimizer_names"):
        MonitorConfig(optimizer_names=names)


def test_optimizer_names_from_yaml(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("monitor_config:\n  optimizer_names: {optD: critic, netG: actor}\n")
    assert MonitorConfig.from_yaml(path).optimizer_names == {"optD": "critic", "netG": "actor"}
