"""MindFormers ``monitor_config`` blocks load as they are (TrainingStateMonitor, 2.1.0 keys)."""

import re
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

import msmon_nb as mm
from msmon_nb.config import CORE_METRICS, ConfigError, MonitorConfig
from msmon_nb.config.alerts import resolve_settings
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.config.mindformers import UNSUPPORTED, invert_targets
from tests.support import tiny

# MindFormers' own defaults (mindformers/tools/register/template.py, MonitorConfig): every
# key spelled out, all of them "off"
TEMPLATE = {
    "monitor_on": False,
    "dump_path": "./dump",
    "target": None,
    "invert": False,
    "step_interval": 1,
    "local_loss_format": None,
    "local_norm_format": None,
    "device_local_norm_format": None,
    "device_local_loss_format": None,
    "optimizer_state_format": None,
    "weight_state_format": None,
    "max_attention_logit_format": None,
    "throughput_baseline": None,
    "print_struct": False,
    "check_for_global_norm": False,
    "global_norm_spike_threshold": 3.0,
    "global_norm_spike_count_threshold": 10,
    "stable_rank_config": {"format": None, "step_interval": 100, "target": [".*"]},
    "health_checkpoint": None,
}

MINDFORMERS_YAML = """\
seed: 0
run_mode: 'train'
output_dir: './output'
trainer:
  type: CausalLanguageModelingTrainer
  model_name: 'llama2_7b'
runner_config:
  epochs: 2
  batch_size: 1
monitor_config:
  monitor_on: True
  dump_path: './dump'
  target: ['layers.0', 'layers.1', 'attention']
  invert: False
  step_interval: 10
  local_loss_format: ['log', 'tensorboard']
  device_local_loss_format: ['log', 'tensorboard']
  local_norm_format: ['log', 'tensorboard']
  device_local_norm_format: ['log', 'tensorboard']
  optimizer_state_format: null
  weight_state_format: ['log']
  throughput_baseline: null
  print_struct: False
  check_for_global_norm: False
  global_norm_spike_threshold: 1.0
  global_norm_spike_count_threshold: 10
callbacks:
  - type: MFLossMonitor
"""


def load(data):
    """``from_dict`` and the MonitorWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = MonitorConfig.from_dict(data)
    return config, [w for w in caught if issubclass(w.category, MonitorWarning)]


def named(message, key):
    """How often ``key`` is named in the warning (not as part of a longer key)."""
    return len(re.findall(rf"(?<![a-z_]){key} \(", message))


def test_template_defaults_load_silently():
    config, caught = load({"monitor_config": TEMPLATE})
    assert caught == []
    assert config.enable_monitor is False
    assert config.save_dir == "./dump"
    assert config.log_interval == 1
    assert config.param_targets == [".*"]
    assert config.track_metrics == list(CORE_METRICS)
    assert config.alerts == {}
    assert config.throughput_baseline is None


def test_mindformers_yaml_file_loads(tmp_path):
    path = tmp_path / "finetune_llama2_7b.yaml"
    path.write_text(MINDFORMERS_YAML)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = MonitorConfig.from_yaml(path)
    assert config.enable_monitor is True
    assert config.log_interval == 10
    assert config.save_dir == "./dump"
    assert config.param_targets == ["layers.0", "layers.1", "attention"]
    assert "param_stats" in config.track_metrics  # weight_state_format
    assert config.alerts == {}  # the threshold alone checks nothing in MindFormers
    ours = [w for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert named(message, "local_norm_format") == 1
    for key in (
        "optimizer_state_format",
        "weight_state_format",
        "throughput_baseline",
        "local_loss_format",  # train/local_loss, train/local_grad_norm (collect/comm.py)
        "device_local_loss_format",
        "device_local_norm_format",
    ):
        assert named(message, key) == 0
    assert "ignored" in message


# key -> a value that asks for something, and what it becomes in our config (None: it is
# named in the warning and ignored)
MAPPED = {
    "monitor_on": (True, lambda c: c.enable_monitor is True),
    "dump_path": ("./mf_dump", lambda c: c.save_dir == "./mf_dump"),
    "step_interval": (25, lambda c: c.log_interval == 25),
    "target": (["layers.[01]"], lambda c: c.param_targets == ["layers.[01]"]),
    "invert": (True, lambda c: not re.search(c.param_targets[0], "layers.0.w")),
    "weight_state_format": ("tensorboard", lambda c: "param_stats" in c.track_metrics),
    "optimizer_state_format": (["log"], lambda c: "optimizer_state" in c.track_metrics),
    # each rank's train/local_grad_norm and train/local_loss come with grad_norm and loss
    "device_local_norm_format": (["tensorboard"], lambda c: "grad_norm" in c.track_metrics),
    "local_loss_format": (["log", "tensorboard"], lambda c: "loss" in c.track_metrics),
    "device_local_loss_format": ("log", lambda c: "loss" in c.track_metrics),
    "throughput_baseline": (1200.5, lambda c: c.throughput_baseline == 1200.5),
    # collect/stablerank.py: every 100 steps at log_interval 1, its own targets
    "stable_rank_config": (
        {"format": ["log"], "step_interval": 100, "target": ["attention"]},
        lambda c: (
            "stable_rank" in c.track_metrics
            and c.stable_rank_every == 100
            and c.stable_rank_targets == ["attention"]
        ),
    ),
    "check_for_global_norm": (
        True,
        lambda c: c.alerts == {"grad_explosion": {"ceiling": 3.0}},  # MindFormers' default
    ),
    "global_norm_spike_threshold": (5.0, lambda c: c.alerts == {}),
    "use_skip_data_by_global_norm": (
        True,  # the train-step wrapper's default threshold, fixed (no relative criterion)
        lambda c: (
            c.alerts
            == {"grad_explosion": {"action": "skip", "skip_above": 1.0, "skip_relative": False}}
        ),
    ),
}
IGNORED = {
    "local_norm_format": "log",
    "max_attention_logit_format": "tensorboard",
    "print_struct": True,
    "health_checkpoint": {"embedding_local_norm_threshold": 1.0},
}


@pytest.mark.parametrize("key", sorted(MAPPED))
def test_each_mapped_key(key):
    value, check = MAPPED[key]
    config, caught = load({"monitor_config": {key: value}})
    assert check(config), config
    assert caught == []


@pytest.mark.parametrize("key", sorted(IGNORED))
def test_each_unsupported_key_warns_once(key):
    config, caught = load({"monitor_config": {key: IGNORED[key]}})
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"{key} (" in message
    assert "not supported yet, ignored" in message
    assert config == MonitorConfig()


def test_skip_maps_threshold_and_count():
    """use_skip_data_by_global_norm (top level of a MindFormers YAML, beside
    monitor_config) becomes grad_explosion action skip with its threshold, and the count
    threshold the number of skips in a row that stops the run (tests/collect/test_skip.py
    runs it)."""
    config, caught = load(
        {
            "use_skip_data_by_global_norm": True,
            "monitor_config": {
                "global_norm_spike_threshold": 3.0,
                "global_norm_spike_count_threshold": 5,
            },
        }
    )
    assert caught == []
    settings = resolve_settings(config.alerts)
    assert settings["grad_explosion"]["action"] == "skip"
    assert settings["grad_explosion"]["skip_above"] == 3.0
    assert settings["grad_explosion"]["skip_relative"] is False
    assert settings["max_skips_in_a_row"] == 5
    with pytest.raises(ConfigError, match="max_skips_in_a_row=3"):
        MonitorConfig.from_dict(
            {
                "use_skip_data_by_global_norm": True,
                "global_norm_spike_count_threshold": 5,
                "alerts": {"max_skips_in_a_row": 3},
            }
        )


def test_stable_rank_config_interval_targets_and_aggregation():
    """step_interval is steps, stable_rank_every collected steps: divided by the
    interval, rounded up; a null target selects every parameter (MindFormers' default,
    whatever the monitor's target); do_aggregation (merged shards) is named as not done;
    a null format asks for nothing."""
    config, caught = load(
        {
            "monitor_config": {
                "step_interval": 8,
                "target": ["layers.0"],
                "stable_rank_config": {"format": "log", "step_interval": 20, "target": None},
            }
        }
    )
    assert caught == []
    assert config.stable_rank_every == 3 and config.stable_rank_targets == [".*"]
    assert config.param_targets == ["layers.0"]
    config, caught = load(
        {"monitor_config": {"stable_rank_config": {"format": "log", "do_aggregation": True}}}
    )
    assert "stable_rank" in config.track_metrics
    assert len(caught) == 1
    assert named(str(caught[0].message), "stable_rank_config.do_aggregation") == 1
    config, caught = load({"monitor_config": {"stable_rank_config": {"format": None}}})
    assert "stable_rank" not in config.track_metrics and caught == []
    for bad, text in (
        ({"step_interval": 0}, "step_interval=0"),
        ({"power_iteration_num": 2.5}, "power_iteration_num=2.5"),
        ({"target": "attention"}, "target='attention'"),
        ({"target": ["(["]}, "target='(['"),
    ):
        with pytest.raises(ConfigError, match=re.escape(text)) as info:
            MonitorConfig.from_dict({"monitor_config": {"stable_rank_config": bad}})
        assert "for example" in str(info.value)


def test_every_key_at_once_one_warning_listing_all_unsupported():
    data = {key: value for key, (value, _check) in MAPPED.items()}
    data.update(IGNORED)
    data.pop("use_skip_data_by_global_norm")  # MindFormers forbids it with check_for_global_norm
    config, caught = load({"monitor_config": data})
    assert len(caught) == 1
    message = str(caught[0].message)
    for key in IGNORED:
        assert named(message, key) == 1, key
    for key in MAPPED:
        assert f"{key} (" not in message
    assert set(UNSUPPORTED) == set(IGNORED)
    assert config.log_interval == 25
    assert config.alerts == {"grad_explosion": {"ceiling": 5.0}}
    assert config.throughput_baseline == 1200.5
    assert resolve_settings(config.alerts)["grad_explosion"]["ceiling"] == 5.0


def test_threshold_from_yaml_text_and_existing_alerts_kept():
    config, _ = load(
        {
            "check_for_global_norm": True,
            "global_norm_spike_threshold": "1e4",  # PyYAML reads 1e4 as a string
            "alerts": {"grad_explosion": {"factor": 50.0, "action": "stop"}},
        }
    )
    assert config.alerts == {"grad_explosion": {"factor": 50.0, "action": "stop", "ceiling": 1e4}}


def mindformers_selects(targets, invert, name):
    """TrainingStateMonitor._check_param_name, as in mindformers 2.1.0."""
    for pattern in targets:
        if re.search(pattern, name) is not None:
            return not invert
    return invert


NAMES = [
    "model.layers.0.attention.wq.weight",
    "model.layers.1.feed_forward.w1.weight",
    "model.layers.10.Attention.wk.weight",
    "model.tok_embeddings.embedding_weight",
    "model.norm_out.weight",
    "lm_head.weight",
]


@pytest.mark.parametrize(
    "targets",
    [
        ["layers.[01]"],
        ["attention", "norm"],
        ["(?i)attention"],
        ["^lm_head", "weight$"],
        [".*"],
        ["layers\\.(\\d+)\\.attention"],
    ],
)
@pytest.mark.parametrize("invert", [False, True])
def test_target_invert_select_what_mindformers_selects(targets, invert):
    config, _ = load({"target": targets, "invert": invert})
    ours = [n for n in NAMES if any(re.search(p, n) for p in config.param_targets)]
    theirs = [n for n in NAMES if mindformers_selects(targets, invert, n)]
    assert ours == theirs


BAD = [
    ("local_norm_format", "csv"),
    ("optimizer_state_format", ["log", "screen"]),
    ("weight_state_format", 1),
    ("invert", "yes"),
    ("print_struct", 1),
    ("check_for_global_norm", "true"),
    ("use_skip_data_by_global_norm", 0),
    ("global_norm_spike_threshold", -1.0),
    ("global_norm_spike_threshold", "high"),
    ("global_norm_spike_count_threshold", 0),
    ("global_norm_spike_count_threshold", 2.5),
    ("throughput_baseline", 0),
    ("throughput_baseline", -5.0),
    ("throughput_baseline", "1e3"),
    ("throughput_baseline", True),
    ("stable_rank_config", "log"),
    ("step_interval", None),
    ("target", "layers.0"),
    ("target", ["layers.(["]),
]


@pytest.mark.parametrize(("key", "value"), BAD, ids=[f"{k}-{i}" for i, (k, _) in enumerate(BAD)])
@pytest.mark.parametrize("invert", [False, True])
def test_bad_value_names_key_value_and_example(key, value, invert):
    data = {key: value}
    if invert and key != "invert":
        data["invert"] = True  # the inverted path checks the regexes itself
    with pytest.raises(ConfigError) as info:
        MonitorConfig.from_dict({"monitor_config": data})
    message = str(info.value)
    assert key in message
    assert repr(value) in message or repr(value[0]) in message
    assert "for example" in message


def test_conflicts_are_errors():
    with pytest.raises(ConfigError, match=r"check_for_global_norm.*use_skip_data_by_global_norm"):
        MonitorConfig.from_dict(
            {"check_for_global_norm": True, "use_skip_data_by_global_norm": True}
        )
    with pytest.raises(ConfigError, match="ceiling twice"):
        MonitorConfig.from_dict(
            {
                "check_for_global_norm": True,
                "global_norm_spike_threshold": 5.0,
                "alerts": {"grad_explosion": {"ceiling": 7.0}},
            }
        )
    with pytest.raises(ConfigError, match="twice"):
        MonitorConfig.from_dict({"step_interval": 2, "log_interval": 2})


def test_replace_keeps_mapping_without_warning_again():
    config, _ = load({"target": ["layers.0"], "invert": True, "throughput_baseline": 100.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = config.replace(log_interval=3)
    assert again.param_targets == config.param_targets
    assert again.throughput_baseline == 100.0


def test_invert_targets_is_one_regex():
    pattern = invert_targets(["a", "(?i)b"])
    assert re.search(pattern, "xyz")
    assert not re.search(pattern, "xay")
    assert not re.search(pattern, "xBy")


def test_linearity_recorded_in_real_training(tmp_path):
    """A tiny MindSpore training, configured by a MindFormers block: train/linearity is
    train/throughput over the baseline (one rank) at every collected step."""
    path = tmp_path / "mf.yaml"
    path.write_text(
        "monitor_config:\n"
        "  monitor_on: True\n"
        f"  dump_path: '{tmp_path / 'runs'}'\n"
        "  step_interval: 2\n"
        "  throughput_baseline: 500.0\n"
        "  weight_state_format: ['tensorboard']\n"
        "  target: ['^0\\.']\n"
        "  invert: True\n"
    )
    config = MonitorConfig.from_yaml(path)
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    with mm.Monitor(config) as mon:
        for xb, yb in tiny.batches(x, y, batch=32, steps=12):
            loss, grads = grad_fn(xb, yb)
            opt(grads)
            mon.step(loss=loss, grads=grads, batch_size=32, params=net.trainable_params())
    run = mm.load_run(mon.run_dir)
    throughput = run.scalars("train/throughput")
    linearity = run.scalars("train/linearity")
    assert throughput.steps.tolist() == [0, 2, 4, 6, 8, 10]
    assert linearity.steps.tolist() == throughput.steps.tolist()
    assert (throughput.values > 0).all()
    # both stored as float32 scalars
    np.testing.assert_allclose(linearity.values, throughput.values / 500.0, rtol=1e-6)
    param_tags = sorted(t for t in run.tags if t.startswith("param/"))
    assert param_tags == [
        "param/2.bias/grad_norm",
        "param/2.bias/weight_norm",
        "param/2.weight/grad_norm",
        "param/2.weight/weight_norm",
    ]


def test_no_linearity_without_baseline(tmp_path):
    with mm.Monitor(save_dir=str(tmp_path)) as mon:
        for _ in range(3):
            mon.step(loss=1.0, batch_size=8)
    run = mm.load_run(mon.run_dir)
    assert "train/throughput" in run.tags
    assert "train/linearity" not in run.tags


def test_check_for_global_norm_alerts_at_the_threshold(tmp_path):
    """MindFormers' check fires at global_norm >= threshold; so does the mapped ceiling."""
    config = MonitorConfig.from_dict(
        {
            "monitor_config": {
                "dump_path": str(tmp_path),
                "check_for_global_norm": True,
                "global_norm_spike_threshold": 3.0,
            }
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)  # the alert's own notice
        with mm.Monitor(config) as mon:
            for norm in [1.0, 1.1, 0.9, 2.99, 3.0, 1.0]:
                mon.step(loss=1.0, grad_norm=norm, batch_size=4)
    alerts = mm.load_run(mon.run_dir).alerts
    assert [(a.kind, a.step) for a in alerts] == [("grad_explosion", 4)]


# MindFormers 2.1.0's place for the spike threshold (its TrainingStateMonitor reads it
# from health_checkpoint, and it switches the check on), as its configs spell it
HEALTH_YAML = """\
run_mode: 'train'
trainer:
  type: CausalLanguageModelingTrainer
  model_name: 'llama2_7b'
monitor_config:
  monitor_on: True
  dump_path: '{dump}'
  step_interval: 1
  health_checkpoint:
    global_norm_spike_threshold: 3.0
"""


def test_health_checkpoint_threshold_is_the_ceiling(tmp_path):
    """2.1.0's ``monitor_config.health_checkpoint.global_norm_spike_threshold`` alerts at
    the first step with grad_norm >= it, as MindFormers' check does; no warning."""
    path = tmp_path / "pretrain.yaml"
    path.write_text(HEALTH_YAML.format(dump=tmp_path / "runs"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = MonitorConfig.from_yaml(path)
    assert [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)] == []
    assert config.alerts == {"grad_explosion": {"ceiling": 3.0}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)  # the alert's own notice
        with mm.Monitor(config) as mon:
            for norm in [1.0, 1.1, 0.9, 2.99, 3.0, 1.0]:
                mon.step(loss=1.0, grad_norm=norm, batch_size=4)
    alerts = mm.load_run(mon.run_dir).alerts
    assert [(a.kind, a.step) for a in alerts] == [("grad_explosion", 4)]


def test_health_checkpoint_wins_over_the_deprecated_pair_and_embedding_norm_warns():
    config, caught = load(
        {
            "monitor_config": {
                "check_for_global_norm": True,
                "global_norm_spike_threshold": 9.0,  # deprecated in 2.1.0: the new one wins
                "health_checkpoint": {
                    "global_norm_spike_threshold": 2.5,
                    "embedding_local_norm_threshold": 1.0,
                },
            }
        }
    )
    assert config.alerts == {"grad_explosion": {"ceiling": 2.5}}
    assert len(caught) == 1 and named(str(caught[0].message), "health_checkpoint") == 1
    with pytest.raises(ConfigError, match="use_skip_data_by_global_norm"):
        MonitorConfig.from_dict(  # MindFormers refuses the pair too
            {
                "use_skip_data_by_global_norm": True,
                "monitor_config": {"health_checkpoint": {"global_norm_spike_threshold": 2.5}},
            }
        )


# MindFormers 2.1.0's PyNative trainer config (pynative/config/config.py TrainConfig): no
# monitor_config, a monitor: section instead
PYNATIVE_YAML = """\
checkpoint:
  enable_save: False
training:
  steps: 10
  local_batch_size: 1
  max_norm: 1.0
optimizer:
  type: AdamW
parallelism:
  tensor_parallel: 1
"""


def test_pynative_section_maps_what_it_means(tmp_path):
    text = PYNATIVE_YAML + (
        "monitor:\n"
        "  train_state:\n"
        "    local_norm: ['layers.0']\n"
        "    local_loss: True\n"
        "    device_norm: ['layers.0.attention', 'lm_head']\n"
        "    device_loss: True\n"
        "  tensorboard:\n"
        f"    output_dir: '{tmp_path / 'tb'}'\n"
        "    log_interval: 5\n"
        "    queue_size: 1000\n"
        "  health_checkpoint:\n"
        "    global_norm_skip_threshold: 100.0\n"
    )
    path = tmp_path / "pretrain_pynative.yaml"
    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = MonitorConfig.from_yaml(path)
    ours = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(ours) == 1, ours
    assert "monitor.train_state.local_norm (" in ours[0]
    assert "monitor.health_checkpoint (" in ours[0]
    assert config.enable_monitor is True
    assert "param_stats" in config.track_metrics and "loss" in config.track_metrics
    # device_norm's fragments are found anywhere in a name, as MindFormers finds them
    assert any(re.search(t, "model.layers.0.attention.wq.weight") for t in config.param_targets)
    assert not any(re.search(t, "model.layers.1.attention.wq.weight") for t in config.param_targets)
    assert config.save_dir == str(tmp_path / "tb") and config.log_interval == 5


def test_mindformers_yaml_without_a_monitor_block_says_so(tmp_path):
    """Before: ``monitor_config has no field 'checkpoint'``, about a key of the user's
    training config."""
    path = tmp_path / "pretrain_pynative.yaml"
    path.write_text(PYNATIVE_YAML)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = MonitorConfig.from_yaml(path)
    ours = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(ours) == 1 and "no monitor_config: (graph mode) or monitor: (PyNative)" in ours[0]
    assert config == MonitorConfig()
    config, caught = load({"monitor": {"train_state": {"device_loss": True}}, "training": {}})
    assert caught == [] and config == MonitorConfig()
    with pytest.raises(ConfigError, match=r"monitor\.train_state\.device_nrom"):
        load({"training": {}, "monitor": {"train_state": {"device_nrom": True}}})
    with pytest.raises(ConfigError, match="has no field 'checkpiont'"):
        load({"checkpiont": 1, "log_interval": 2})  # ours, with a typo: still an error


def test_monitor_on_false_says_once_that_monitoring_is_off(tmp_path):
    config, caught = load({"monitor_config": {**TEMPLATE, "dump_path": str(tmp_path)}})
    assert caught == []  # loading asks for nothing yet
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mm.Monitor(config) as mon:
            for _ in range(3):
                mon.step(loss=1.0)
    ours = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(ours) == 1 and "monitoring is off" in ours[0] and "monitor_on" in ours[0]
    assert mon.run_dir is None
