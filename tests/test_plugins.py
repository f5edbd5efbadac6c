"""A projection of the user's own, outside nlq: registered by a module named in NLQ_IMPORT or in a plan's
imports, it trains, evaluates, exports and runs in a plan like nlq's own; the run records its code's hash, and a
changed file is refused wherever the run is used; its init, options and width are its own and checked early."""

import hashlib
import json
import sys

import pytest
import torch

from helpers import SMALL, one_line_error, tiny_model_config, train_small
from nlq import plugins
from nlq.errors import UserError
from nlq.model import Transformer
from nlq.projections import BUILT_IN, PROJECTIONS, LinearProjection, Projection, register_projection

PLUGIN = '''
import torch
from torch import nn

from nlq.projections import Projection, register_projection


class TanhQuery(Projection):
    """Q = tanh(X W): the user's own variant, written with nothing but forward (from_config is the default)."""

    def __init__(self, dim):
        super().__init__()
        self.weight_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return torch.tanh(self.weight_proj(x))


class PlainLinear(Projection):
    """X W with its own matmul (no input_weight to share): must compute exactly what nlq's linear does."""

    def __init__(self, dim):
        super().__init__()
        self.weight_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.weight_proj(x)


register_projection("tanh-query", TanhQuery)
register_projection("plain-linear")(PlainLinear)  # the decorator form
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin file, and the registry and sys.modules put back afterwards."""
    path = tmp_path / "my_projection.py"
    path.write_text(PLUGIN)
    saved = dict(PROJECTIONS)
    yield path
    PROJECTIONS.clear()
    PROJECTIONS.update(saved)
    sys.modules.pop("my_projection", None)


def test_a_registered_projection_of_ones_own_computes_what_the_same_math_built_in_does(plugin):
    """A projection without a shared first matmul goes through attention's fallback (finish = forward): with the
    weights of nlq's linear query it gives the same logits, fused or not."""
    plugins.import_modules([str(plugin)])
    assert {"tanh-query", "plain-linear"} <= set(PROJECTIONS) and BUILT_IN == {"linear", "identity", "residual",
                                                                                 "nonlinear"}
    reference = Transformer(tiny_model_config(query="linear"), seed=3)
    own = Transformer(tiny_model_config(query="plain-linear"), seed=3)
    assert set(own.state_dict()) == set(reference.state_dict())
    own.load_state_dict(reference.state_dict())
    x = torch.randint(0, 97, (2, 16))
    for fused in (True, False):
        for block in own.blocks:
            block.attn.fused_input = fused
        torch.testing.assert_close(own(x)[0], reference(x)[0], rtol=1e-5, atol=1e-6)


def test_identity_query_key_and_value_run_without_any_matmul_to_share():
    from nlq.config import ProjectionsConfig

    config = tiny_model_config(query="identity", projections=ProjectionsConfig(k="identity", v="identity"))
    model = Transformer(config, seed=0)
    logits, _ = model(torch.randint(0, 97, (2, 16)))
    assert logits.shape == (2, 16, 97) and torch.isfinite(logits).all()


def test_register_refuses_nlqs_own_names_bad_names_and_non_modules():
    with pytest.raises(ValueError, match="one of nlq's own projections"):
        register_projection("nonlinear", LinearProjection)
    with pytest.raises(ValueError, match="lower-case letters"):
        register_projection("My Query", LinearProjection)
    with pytest.raises(TypeError, match="nn.Module class with from_config"):
        register_projection("mine", object)
    assert issubclass(LinearProjection, Projection) and "mine" not in PROJECTIONS


def test_nlq_import_trains_records_the_module_and_evaluates_a_run_of_ones_own(plugin, byte_data, tmp_path,
                                                                              monkeypatch, capsys):
    from nlq.cli import main

    monkeypatch.setenv("NLQ_IMPORT", str(plugin))
    run = train_small(byte_data, tmp_path / "run", "--model.query=tanh-query")
    config = json.loads((run / "config.json").read_text())
    record = json.loads((run / "summary.json").read_text())["record"]
    assert config["model"]["query"] == "tanh-query"
    assert record["projections"] == {"tanh-query": {"class": "my_projection.TanhQuery", "file": str(plugin.resolve()),
                                                    "sha256": hashlib.sha256(plugin.read_bytes()).hexdigest()}}
    capsys.readouterr()
    main(["eval", str(run)])
    assert "loss" in capsys.readouterr().out


def test_without_its_module_a_projection_of_ones_own_is_a_one_line_error_that_says_how(byte_data, tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.delenv("NLQ_IMPORT", raising=False)
    one_line_error(capsys, ["train", "--data", byte_data, "--out", tmp_path / "x", "--preset", "nano", *SMALL,
                            "--model.query=tanh-query"], "NLQ_IMPORT")


@pytest.mark.parametrize("entries,needle", [
    (["no_such_module_anywhere"], "no module named 'no_such_module_anywhere' on the Python path"),
    (["missing.py"], "missing.py does not exist"),
])
def test_a_bad_nlq_import_is_one_line(tmp_path, capsys, monkeypatch, entries, needle):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NLQ_IMPORT", ",".join(entries))
    one_line_error(capsys, ["info", "nano"], needle)
    with pytest.raises(UserError, match="is not a module name or a .py file"):
        plugins.import_modules([""])


def test_an_error_inside_ones_own_module_names_its_file_and_line(tmp_path, capsys, monkeypatch):
    broken = tmp_path / "broken_projection.py"
    broken.write_text("import torch\n\nx = 1\nraise RuntimeError('my bug')\n")
    monkeypatch.setenv("NLQ_IMPORT", str(broken))
    err = one_line_error(capsys, ["info", "nano"], "my bug")
    assert f"{broken.resolve()}:4" in err and "RuntimeError" in err
    assert "broken_projection" not in sys.modules


def test_a_plan_imports_its_projection_from_beside_it_and_freezes_that(plugin, byte_data, tmp_path, capsys):
    """`imports` in a plan file: a .py file relative to the plan; the dry run lists the arm of one's own."""
    from nlq.cli import main
    from test_plans import plan_text

    plan = plan_text(tmp_path)  # beside the plugin, in tmp_path
    raw = plan.read_text().replace('query = "nonlinear"', 'query = "tanh-query"')
    plan.write_text('imports = ["my_projection.py"]\n' + raw)
    main(["study", str(plan), "--out", str(tmp_path / "s"), "--data", str(byte_data), "--dry-run"])
    out = capsys.readouterr().out
    assert "mine" in out and "in all: " in out
    assert "tanh-query" in PROJECTIONS
    plan.write_text('imports = ["not_here.py"]\n' + raw)
    one_line_error(capsys, ["study", plan, "--out", tmp_path / "s2", "--dry-run"], "imports: ")
    plan.write_text('imports = "my_projection.py"\n' + raw)
    one_line_error(capsys, ["study", plan, "--out", tmp_path / "s2", "--dry-run"], "imports must be a list")


def test_a_study_freezes_the_code_of_its_arms_own_projection(plugin, byte_data, tmp_path, monkeypatch):
    """study.json records the file and sha256 of a projection of one's own; a changed file is refused on the next
    start, as a changed plan is; nlq's own projections record nothing."""
    from helpers import fake_training, tiny_run_config
    from nlq.studies.definition.design import Arm, DataSpec, Study
    from nlq.studies.running.study import run_study

    plugins.import_modules([str(plugin)])
    fake_training(monkeypatch)
    study = Study("own", "", tiny_run_config(byte_data), [Arm("linear", {"model": {"query": "linear"}}),
                                                          Arm("tanh", {"model": {"query": "tanh-query"}})],
                  seeds=[1], data=DataSpec("unused", "byte"))
    run_study(study, tmp_path / "s", data_dir=str(byte_data), log=lambda *_: None)
    recorded = json.loads((tmp_path / "s" / "study.json").read_text())["projections"]
    assert recorded == {"tanh-query": {"class": "my_projection.TanhQuery", "file": str(plugin.resolve()),
                                       "sha256": hashlib.sha256(plugin.read_bytes()).hexdigest()}}
    run_study(study, tmp_path / "s", data_dir=str(byte_data), log=lambda *_: None)  # unchanged: resumes
    plugin.write_text(PLUGIN + "\n# edited after the study started\n")
    with pytest.raises(UserError, match="the code of a study's arm is frozen once it has run"):
        run_study(study, tmp_path / "s", data_dir=str(byte_data), log=lambda *_: None)
    from nlq.studies.running.dry_run import dry_run_text

    with pytest.raises(UserError, match="the code of a study's arm is frozen once it has run"):  # it said "0 tokens"
        dry_run_text(study, tmp_path / "s", data_dir=str(byte_data))
    linear_only = Study("lin", "", tiny_run_config(byte_data), [Arm("linear", {"model": {"query": "linear"}})],
                        seeds=[1], data=DataSpec("unused", "byte"))
    run_study(linear_only, tmp_path / "lin", data_dir=str(byte_data), log=lambda *_: None)
    assert "projections" not in json.loads((tmp_path / "lin" / "study.json").read_text())


OWN_INIT = '''
import torch
from torch import nn

from nlq.projections import Projection, register_projection


class GatedResidualQuery(Projection):
    """Q = X W + up(tanh(down(X))), the correction's up-projection zero-initialised: it starts as a linear query."""

    def __init__(self, dim):
        super().__init__()
        self.weight_proj = nn.Linear(dim, dim, bias=False)
        self.down = nn.Linear(dim, dim // 4, bias=False)
        self.up = nn.Linear(dim // 4, dim, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return self.weight_proj(x) + self.up(torch.tanh(self.down(x)))


class DefaultInitQuery(GatedResidualQuery):
    """The same, asking for nlq's init: N(0, 0.02) per parameter name, shared with linear's weight_proj."""

    default_init = True


class TooWide(Projection):
    def __init__(self, dim):
        super().__init__()
        self.weight_proj = nn.Linear(dim, 2 * dim, bias=False)

    def forward(self, x):
        return self.weight_proj(x)


register_projection("gated-residual", GatedResidualQuery)
register_projection("default-init", DefaultInitQuery)
register_projection("too-wide", TooWide)
'''


def imported(tmp_path, name: str, source: str):
    """A plugin module written and imported for one test; the registry and sys.modules put back after it."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    saved = dict(PROJECTIONS)
    plugins.import_modules([str(path)])
    yield path
    PROJECTIONS.clear()
    PROJECTIONS.update(saved)
    sys.modules.pop(name, None)


@pytest.fixture
def own_init(tmp_path):
    yield from imported(tmp_path, "own_init", OWN_INIT)


def test_a_projections_own_initialisation_is_kept_reproducible_and_every_other_weight_is_nlqs(own_init):
    """The model used to re-draw every nn.Linear N(0, 0.02), so a zero-initialised up-projection started non-zero.
    Now a projection keeps its constructor's init, drawn under a generator seeded by (seed, its name): the same seed
    gives the same start, another seed another, and every weight outside it is the baseline's, bit for bit."""
    a = Transformer(tiny_model_config(query="gated-residual"), seed=5).state_dict()
    again = Transformer(tiny_model_config(query="gated-residual"), seed=5).state_dict()
    other = Transformer(tiny_model_config(query="gated-residual"), seed=6).state_dict()
    linear = Transformer(tiny_model_config(query="linear"), seed=5).state_dict()
    assert all(torch.count_nonzero(a[f"blocks.{i}.attn.q_proj.up.weight"]) == 0 for i in range(2))
    assert all(torch.equal(a[k], again[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.q_proj.down.weight"], other["blocks.0.attn.q_proj.down.weight"])
    assert not torch.equal(a["blocks.0.attn.q_proj.down.weight"], a["blocks.1.attn.q_proj.down.weight"])
    outside = [k for k in a if ".q_proj." not in k]
    assert outside and all(torch.equal(a[k], linear[k]) for k in outside)
    # its own init, not nlq's: torch's default for nn.Linear is uniform(+-1/sqrt(fan_in)), wider than N(0, 0.02)
    assert a["blocks.0.attn.q_proj.weight_proj.weight"].abs().max() > 0.1


def test_a_projection_that_asks_for_the_default_init_shares_its_named_weights_with_the_baseline(own_init):
    a = Transformer(tiny_model_config(query="default-init"), seed=5).state_dict()
    linear = Transformer(tiny_model_config(query="linear"), seed=5).state_dict()
    assert torch.equal(a["blocks.0.attn.q_proj.weight_proj.weight"], linear["blocks.0.attn.q_proj.weight_proj.weight"])
    assert torch.count_nonzero(a["blocks.0.attn.q_proj.up.weight"]) > 0  # nlq's init overrides the zeros


def test_a_projection_of_the_wrong_width_is_one_line_at_once_in_info_and_train(own_init, byte_data, tmp_path, capsys,
                                                                              monkeypatch):
    """It used to pass `nlq info` and die in `nlq train` with "shape '[8, 64, 4, 16]' is invalid"."""
    monkeypatch.setenv("NLQ_IMPORT", str(own_init))
    needle = "projection 'too-wide' (TooWide) maps a (1, 2, 128) float32 input to shape (1, 2, 256), torch.float32"
    one_line_error(capsys, ["info", "micro", "--model.query=too-wide"], needle)
    one_line_error(capsys, ["train", "--data", byte_data, "--out", tmp_path / "x", "--preset", "nano", *SMALL,
                            "--model.query=too-wide"], "projection 'too-wide' (TooWide) maps")
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_a_changed_plugin_file_is_refused_wherever_a_run_of_it_is_used(plugin, byte_data, tmp_path, monkeypatch,
                                                                       capsys):
    """`NLQ_IMPORT=<a changed file> nlq eval RUN` used to score another function without a word; eval, sample,
    export and a resumed train now compare the file's sha256 with the one the run recorded, and refuse in one line."""
    from nlq.cli import main

    monkeypatch.setenv("NLQ_IMPORT", str(plugin))
    run = train_small(byte_data, tmp_path / "run", "--model.query=tanh-query")
    main(["eval", str(run)])  # the same file: fine
    before = hashlib.sha256(plugin.read_bytes()).hexdigest()
    plugin.write_text(PLUGIN.replace("torch.tanh(self.weight_proj(x))", "torch.sigmoid(self.weight_proj(x))"))
    PROJECTIONS.pop("tanh-query")
    sys.modules.pop("my_projection", None)
    plugins.import_modules([str(plugin)])
    after = hashlib.sha256(plugin.read_bytes()).hexdigest()
    needle = f"was made with projection tanh-query from {plugin.resolve()} (sha256 {before[:16]}), and the code " \
             f"imported now, {plugin.resolve()}, has sha256 {after[:16]}: restore the file it was made with"
    capsys.readouterr()
    for argv in (["eval", run], ["sample", run, "--prompt", "a", "--max-new-tokens", "2"],
                 ["train", "--data", byte_data, "--out", run, "--resume", "--train.max_steps=6"]):
        one_line_error(capsys, argv, needle)


OPTIONED = '''
from dataclasses import dataclass

import torch
from torch import nn

from nlq.projections import Projection, register_projection


class BottleneckTanh(Projection):
    """Q = X W + up(tanh(down(X))), the bottleneck's width and scale set from the config."""

    @dataclass
    class Options:
        rank: int = 8
        scale: float = 1.0

        def __post_init__(self):
            if self.rank < 1:
                raise ValueError(f"rank={self.rank} must be >= 1")

    def __init__(self, dim, rank=8, scale=1.0):
        super().__init__()
        self.scale = scale
        self.weight_proj = nn.Linear(dim, dim, bias=False)
        self.down, self.up = nn.Linear(dim, rank, bias=False), nn.Linear(rank, dim, bias=False)

    def forward(self, x):
        return self.weight_proj(x) + self.scale * self.up(torch.tanh(self.down(x)))


register_projection("bottleneck-tanh", BottleneckTanh)
'''


@pytest.fixture
def optioned(tmp_path):
    yield from imported(tmp_path, "optioned", OPTIONED)


def test_a_plugin_takes_its_options_from_the_command_line_checked_and_recorded(optioned, byte_data, tmp_path, capsys,
                                                                                monkeypatch):
    """`--model.nonlinear_rank=4` used to be ignored silently for a plugin; --model.options.NAME=VALUE reaches its
    constructor, typed by its Options dataclass, and config.json records it; a wrong name or value is one line."""
    from nlq.cli import main

    monkeypatch.setenv("NLQ_IMPORT", str(optioned))
    run = train_small(byte_data, tmp_path / "run", "--model.query=bottleneck-tanh", "--model.options.rank=4",
                      "--model.options.scale=0.5")
    assert json.loads((run / "config.json").read_text())["model"]["options"] == {"rank": 4, "scale": 0.5}  # typed
    model = Transformer(tiny_model_config(query="bottleneck-tanh", options={"rank": "4", "scale": "0.5"}), seed=0)
    assert model.blocks[0].attn.q_proj.down.weight.shape == (4, 32) and model.blocks[0].attn.q_proj.scale == 0.5
    one_line_error(capsys, ["info", "micro", "--model.query=bottleneck-tanh", "--model.options.width=4"],
                   "model.options.width: BottleneckTanh has no such option; its options: rank (int), scale (float)")
    one_line_error(capsys, ["info", "micro", "--model.query=bottleneck-tanh", "--model.options.rank=four"],
                   "model.options.rank='four' is not a valid int")
    one_line_error(capsys, ["info", "micro", "--model.query=bottleneck-tanh", "--model.options.rank=0"],
                   "model.options for BottleneckTanh: rank=0 must be >= 1")
    one_line_error(capsys, ["info", "micro", "--model.options.rank=4"], "model.options={'rank': '4'} sets options of "
                                                                         "a projection of your own")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "bottleneck-tanh (optioned.BottleneckTanh): options rank: int = 8, scale: float = 1.0" in \
        capsys.readouterr().out


def test_a_run_of_ones_own_projection_exports_to_transformers_with_its_module_and_the_same_logits(
        plugin, byte_data, tmp_path, monkeypatch):
    """Export used to refuse a projection of one's own; it ships the module (imports made relative, its sha256 in
    config.json) and transformers' AutoModelForCausalLM computes nlq's logits."""
    transformers = pytest.importorskip("transformers")
    from nlq.interop.export import export_hf
    from nlq.runs.rundir import load_model

    monkeypatch.setenv("NLQ_IMPORT", str(plugin))
    run = train_small(byte_data, tmp_path / "run", "--model.query=tanh-query")
    assert "NlqForCausalLM" in export_hf(run, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["nlq_plugin"]["sha256"] == hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert "from .nlq_projections import" in (tmp_path / "hf" / "nlq_plugin.py").read_text()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    ours, _, _ = load_model(run)
    ids = torch.randint(0, 257, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids)[0], rtol=1e-5, atol=1e-5)


def test_a_projection_that_imports_beyond_torch_is_not_exported(tmp_path):
    """What the shipped module imports must be on the loading side too: torch, nlq's shipped modules and the standard
    library only; anything else is one line that says why, before anything is written."""
    from nlq.interop.export import shipped_plugin

    path = tmp_path / "needs_yaml.py"
    path.write_text("import yaml  # noqa\n" + PLUGIN.replace('"tanh-query"', '"yaml-query"').replace(
        'register_projection("plain-linear")(PlainLinear)', ""))
    saved = dict(PROJECTIONS)
    try:
        plugins.import_modules([str(path)])
        with pytest.raises(UserError, match=r"needs_yaml.py imports yaml: an export ships it beside nlq's model "
                                            r"code, and a module it imports beyond torch"):
            shipped_plugin(tiny_model_config(query="yaml-query"))
    finally:
        PROJECTIONS.clear()
        PROJECTIONS.update(saved)
        sys.modules.pop("needs_yaml", None)


def test_the_nonlinear_querys_rank_given_to_another_projection_is_one_line(capsys):
    """`--model.nonlinear_rank=4` used to be ignored without a word for a projection of one's own."""
    one_line_error(capsys, ["info", "micro", "--model.query=linear", "--model.nonlinear_rank=4"],
                   "model.nonlinear_rank=4 sizes nlq's nonlinear projection, which this model does not use")


def test_a_plan_import_that_calls_sys_exit_is_one_line_naming_the_file(tmp_path, capsys):
    from helpers import one_line_error
    from test_plans import plan_text

    (tmp_path / "quits.py").write_text("import sys\nsys.exit(3)\n")
    plan = plan_text(tmp_path)
    plan.write_text('imports = ["quits.py"]\n' + plan.read_text())
    err = one_line_error(capsys, ["study", str(plan), "--out", str(tmp_path / "s"), "--dry-run"], "sys.exit(3)")
    assert "quits.py" in err


OPTIONAL = '''
from dataclasses import dataclass
from typing import Optional

from torch import nn

from nlq.projections import Projection, register_projection


class MaybeLowRank(Projection):
    """A linear map, low-rank when rank is given; rank None: full, its d-dependent default (d)."""

    @dataclass
    class Options:
        rank: int | None = None
        floor: Optional[int] = None

    def __init__(self, dim, rank=None, floor=None):
        super().__init__()
        self.rank = rank if rank is not None else dim
        self.weight_proj = nn.Sequential(nn.Linear(dim, self.rank, bias=False), nn.Linear(self.rank, dim, bias=False))

    def forward(self, x):
        return self.weight_proj(x)


register_projection("maybe-low-rank", MaybeLowRank)
'''


@pytest.fixture
def optional_plugin(tmp_path):
    yield from imported(tmp_path, "maybe_low_rank", OPTIONAL)


@pytest.mark.parametrize("value, expected", [("4", 4), ("none", None), ("null", None)])
def test_int_or_none_options_accept_a_number_or_none_and_are_recorded_typed(optional_plugin, value, expected):
    config = tiny_model_config(query="maybe-low-rank", options={"rank": value, "floor": value})
    assert config.options == {"rank": expected, "floor": expected}
    model = Transformer(config, seed=0)
    assert model.blocks[0].attn.q_proj.rank == (expected or 32)


def test_a_bad_int_or_none_option_says_what_is_valid(optional_plugin, capsys):
    one_line_error(capsys, ["info", "micro", "--model.query=maybe-low-rank", "--model.options.rank=four"],
                   "model.options.rank='four' is not a valid int | None (int or none)")


KEEPS_W_Q = '''
import torch
from torch import nn

from nlq.projections import Projection, register_projection


class LowRankBeside(Projection):
    """Q = X W_Q + X W_a W_b: W_Q with nlq's init (equal to the baseline's), W_b zero, so it starts as the baseline."""

    nlq_init = ("weight_proj",)

    def __init__(self, dim):
        super().__init__()
        self.weight_proj = nn.Linear(dim, dim, bias=False)
        self.a, self.b = nn.Linear(dim, 4, bias=False), nn.Linear(4, dim, bias=False)
        nn.init.zeros_(self.b.weight)

    def forward(self, x):
        return self.weight_proj(x) + self.b(self.a(x))


register_projection("low-rank-beside", LowRankBeside)
'''


@pytest.fixture
def keeps_w_q(tmp_path):
    yield from imported(tmp_path, "low_rank_beside", KEEPS_W_Q)


def test_a_plugin_keeps_nlqs_init_for_named_weights_and_its_own_for_the_rest(keeps_w_q):
    import torch

    ours = Transformer(tiny_model_config(query="low-rank-beside"), seed=3).state_dict()
    baseline = Transformer(tiny_model_config(), seed=3).state_dict()
    for layer in range(2):
        prefix = f"blocks.{layer}.attn.q_proj"
        assert torch.equal(ours[f"{prefix}.weight_proj.weight"], baseline[f"{prefix}.weight_proj.weight"])
        assert not ours[f"{prefix}.b.weight"].any()  # its own init: zero, not N(0, 0.02)


def test_a_runs_plugin_is_imported_from_its_record_and_refused_when_changed_or_missing(byte_data, tmp_path, capsys):
    """Without NLQ_IMPORT, `nlq eval` (and sample, export, a resumed train) imports the plugin from the file the run
    recorded, after checking its sha256; a changed or missing file is one line naming it."""
    from nlq.cli import main

    source = tmp_path / "recorded_plugin.py"
    source.write_text(PLUGIN.replace('"tanh"', '"tanh-recorded"').replace("'tanh'", "'tanh-recorded'"))
    saved = dict(PROJECTIONS)

    def forget():  # a new process: nothing of the user's imported
        PROJECTIONS.clear()
        PROJECTIONS.update(saved)
        sys.modules.pop("recorded_plugin", None)

    try:
        plugins.import_modules([str(source)])
        name = next(n for n in PROJECTIONS if n not in saved and PROJECTIONS[n].__name__ == "TanhQuery")
        run = train_small(byte_data, tmp_path / "run", f"--model.query={name}")
        forget()
        main(["eval", str(run)])
        assert "loss" in capsys.readouterr().out and name in PROJECTIONS  # imported from the recorded file
        forget()
        main(["train", "--out", str(run), "--resume", "--train.max_steps=6"])  # a resumed run, the same way
        forget()
        source.write_text(source.read_text() + "\n# changed\n")
        one_line_error(capsys, ["eval", str(run)], "now has sha256")
        assert name not in PROJECTIONS  # nothing of the changed file ran
        source.unlink()
        one_line_error(capsys, ["eval", str(run)], "which is missing")
    finally:
        forget()


def test_a_plugin_studys_report_imports_its_recorded_file_and_refuses_a_changed_one(byte_data, tmp_path, capsys,
                                                                                     monkeypatch):
    from helpers import fake_training
    from nlq.cli import main
    from test_plans import plan_text, to_toml

    source = tmp_path / "study_plugin.py"
    source.write_text(PLUGIN)
    plan = plan_text(tmp_path)
    import tomllib

    raw = tomllib.loads(plan.read_text())
    raw["arms"][1]["model"] = {"query": "tanh-query"}
    plan.write_text('imports = ["study_plugin.py"]\n' + to_toml(raw))
    saved = dict(PROJECTIONS)

    def forget():
        PROJECTIONS.clear()
        PROJECTIONS.update(saved)
        sys.modules.pop("study_plugin", None)

    try:
        fake_training(monkeypatch, lambda config, run_dir: {"full_val_loss": 3.0, "tokens": 100,
                                                            "non_embedding_parameters": 10})
        main(["study", str(plan), "--out", str(tmp_path / "s"), "--data", str(byte_data)])
        forget()
        main(["report", str(tmp_path / "s")])  # no NLQ_IMPORT: the recorded file is imported
        table = (tmp_path / "s" / "report.md").read_text().split("| arm | non-embedding parameters")[1]
        assert "n/a" not in table.split("\n\n")[0]
        forget()
        source.write_text(PLUGIN + "\n# changed\n")
        before = (tmp_path / "s" / "report.md").read_bytes()
        one_line_error(capsys, ["report", str(tmp_path / "s")], "study_plugin.py")
        assert (tmp_path / "s" / "report.md").read_bytes() == before  # not rewritten
    finally:
        forget()


MISBEHAVING = '''
import sys

import torch
from torch import nn

from nlq.projections import Projection, register_projection


class FailsToBuild(Projection):
    def __init__(self, dim):
        super().__init__()
        raise ValueError("my init bug")


class ExitsInInit(Projection):
    def __init__(self, dim):
        super().__init__()
        sys.exit(0)


class FailsOnData(Projection):
    """Builds, and fails on the first batch of tokens it reads (a shape check that the trial input in info passes)."""

    def __init__(self, dim):
        super().__init__()
        self.weight_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        if x.size(0) > 1:
            raise RuntimeError("my forward bug")
        return self.weight_proj(x)


class ExitsInForward(FailsOnData):
    def forward(self, x):
        if x.size(0) > 1:
            sys.exit(0)
        return self.weight_proj(x)


register_projection("fails-to-build", FailsToBuild)
register_projection("exits-in-init", ExitsInInit)
register_projection("fails-on-data", FailsOnData)
register_projection("exits-in-forward", ExitsInForward)
'''


@pytest.fixture
def misbehaving(tmp_path):
    yield from imported(tmp_path, "misbehaving", MISBEHAVING)


@pytest.mark.parametrize("name,needle", [("fails-to-build", "raised ValueError: my init bug while nlq built the model"),
                                         ("exits-in-init", "called sys.exit(0) while nlq built the model"),
                                         ("fails-on-data", "raised RuntimeError: my forward bug while the model read "
                                                           "its first batch"),
                                         ("exits-in-forward", "called sys.exit(0) while the model read its first "
                                                              "batch")])
def test_a_projection_that_raises_or_exits_is_one_line_and_leaves_no_run_directory(misbehaving, byte_data, tmp_path,
                                                                                  capsys, monkeypatch, name, needle):
    monkeypatch.setenv("NLQ_IMPORT", str(misbehaving))
    err = one_line_error(capsys, ["train", "--data", byte_data, "--out", tmp_path / "x", "--preset", "nano", *SMALL,
                                  f"--model.query={name}", "--train.max_steps=2"], needle)
    assert f"projection {name} ({misbehaving.resolve()})" in err
    assert not (tmp_path / "x").exists()
    if "init" in name:
        one_line_error(capsys, ["info", "micro", f"--model.query={name}"], needle)


def test_an_error_of_nlqs_own_beside_a_projection_of_ones_own_is_not_blamed_on_it(misbehaving):
    from nlq.own_code import guarded

    with pytest.raises(KeyError):
        with guarded(["fails-on-data"], "testing"):
            raise KeyError("nlq's own")
