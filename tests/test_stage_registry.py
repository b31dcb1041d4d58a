"""``pipeline.stages.STAGES`` is the one order: everything that names stages agrees with it, the
job's stage sections are derived from it, and a new stage is one folder plus its line there."""
import importlib
import sys
import textwrap
import types
import typing

import pytest

from gristmill.errors import ConfigError
from gristmill.pipeline import stages
from gristmill.pipeline.config import JOB_TAIL, JobBase, PrepareConfig, job_model
from gristmill.pipeline.partitions import Partition
from gristmill.pipeline.stages import STAGE_ORDER, STAGES, Stage, job_sections


def _job(tmp_path, **sections):
    return PrepareConfig.from_dict({"inputs": ["unused.jsonl"], "output": {"store": str(tmp_path / "s"), "dataset": "d"},
                                    "work_dir": str(tmp_path / "w"), **sections})


def test_names_are_unique_and_the_order_is_derived_from_stages():
    names = [cls.name for cls in STAGES]
    assert len(set(names)) == len(names)
    assert STAGE_ORDER == tuple(n for cls in STAGES for n in cls.names)
    assert len(set(STAGE_ORDER)) == len(STAGE_ORDER)
    assert all(cls.names[0] == cls.name for cls in STAGES)


@pytest.mark.parametrize("cls", STAGES, ids=lambda c: c.name)
def test_a_stage_section_is_a_job_field_of_its_declared_type_and_default(cls):
    assert issubclass(cls, Stage) and "run" in vars(cls)
    if cls.section is None:
        assert cls.config is None and cls.sections() == ()
        return
    for sec in cls.sections():
        field = PrepareConfig.model_fields[sec.name]
        optional = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
        assert optional == (sec.default is None), f"{cls.name}: job.{sec.name} is optional only when absent means off"
        declared = {a for a in typing.get_args(field.annotation) if a is not type(None)} if optional else {field.annotation}
        assert sec.type in declared, f"{cls.name}: job.{sec.name} is {field.annotation}, not {sec.type}"
        assert field.default == sec.default


def test_the_job_is_its_own_fields_then_the_stage_sections_in_stage_order():
    own = list(JobBase.model_fields)
    assert own == ["inputs", "output", "work_dir", "work_dir_options"]
    sections = [s.name for s in job_sections()]
    assert list(PrepareConfig.model_fields) == own + sections + list(JOB_TAIL)
    # in the order of the stages declaring them; a shared one (tokenizer) sits with the last of them (tokenize)
    last = {sec.name: i for i, cls in enumerate(STAGES) for sec in cls.sections()}
    assert [last[n] for n in sections] == sorted(last[n] for n in sections) and set(last) == set(sections)
    assert sections == ["extract", "language", "exact_dedup", "quality", "fuzzy_dedup", "dedup_against",
                        "decontaminate", "pii", "split", "tokenizer", "pack"]


def test_a_shared_section_must_be_declared_with_one_type():
    class Other(Stage):
        name, section, config = "other", "tokenizer", dict

        def run(self, ctx):
            raise NotImplementedError

    with pytest.raises(TypeError, match="stage other: section tokenizer is"):
        job_sections((*STAGES, Other))


@pytest.mark.parametrize("module", ["stages.extract.tasks", "stages.unique_ids.tasks", "stages.exact_dedup.tasks",
                                    "stages.quality.tasks", "stages.fuzzy_dedup.tasks", "stages.dedup_against.tasks",
                                    "stages.decontaminate.tasks", "dedup_index", "stages.pii.tasks", "stages.tokenize.tasks"])
def test_a_library_stage_name_is_a_stage_name(module):
    lib = importlib.import_module(f"gristmill.pipeline.{module}")
    assert lib.STAGE in [cls.name for cls in STAGES]


def test_the_reports_own_stage_sections_name_stages():
    from gristmill.report.dataset import OWN_SECTIONS

    assert set(OWN_SECTIONS) <= set(STAGE_ORDER)


def test_build_is_stages_filtered_by_from_job(tmp_path):
    every = _job(tmp_path, inputs=[{"path": "unused.jsonl", "id_field": "id"}], quality={}, fuzzy_dedup={},
                 decontaminate={"enabled": False}, dedup_against=[str(tmp_path / "s" / "old" / "v1")])
    assert [s.name for s in stages.build(every)] == [n for n in STAGE_ORDER if n not in ("language", "decontaminate")]
    least = _job(tmp_path, exact_dedup={"enabled": False}, pii={"enabled": False})
    assert [s.name for s in stages.build(least)] == ["extract", "dedup_index", "tokenizer", "tokenize", "pack"]


def test_survivors_advance_from_the_declarations(tmp_path):
    from gristmill.pipeline.survivors import Survivors, Verdicts
    from gristmill.pipeline.workdir import WorkDir

    job = _job(tmp_path, quality={}, fuzzy_dedup={}, split={"validation_fraction": 0.1},
               decontaminate={"eval_sets": [], "against_validation": True})
    s = Survivors(WorkDir(str(tmp_path / "w")))
    for stage in stages.build(job):
        s = s.applying(stage.name, stage.verdicts())
    assert s.removed == (("exact_dedup", ""), ("quality", ""), ("fuzzy_dedup", ""), ("decontaminate", ""),
                         ("decontaminate", "val-"))
    assert s.overrides == (("quality", ""), ("decontaminate", ""), ("decontaminate", "val-"), ("pii", ""))
    assert Verdicts(removed=True, stage="language", applied=False) in stages.Extract.from_job(job).verdicts()


def test_an_artifact_is_looked_up_by_its_type(tmp_path):
    from gristmill.pipeline.runner import SerialRunner
    from gristmill.pipeline.stages.tokenizer.stage import TokenizerFile
    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir(str(tmp_path / "w"))
    ctx = stages.Context(wd, SerialRunner(wd), [])

    class Hands(Stage):
        name = "hands"

        def run(self, ctx):
            return stages.StageResult(self.name, artifact=TokenizerFile("t.json"))

    with pytest.raises(RuntimeError, match="no earlier stage handed on a TokenizerFile"):
        ctx.artifact(TokenizerFile)
    ctx.run(Hands())
    assert ctx.artifact(TokenizerFile) == TokenizerFile("t.json")
    with pytest.raises(RuntimeError, match="already handed on"):
        ctx.run(Hands())


# -- a new stage: one folder and one line ------------------------------------------------------
TOY = {
    "__init__.py": '"""A toy stage, as a new stage is written: a folder of three modules."""\n',
    "config.py": """
        from gristmill.config import Bool, PositiveInt, Section


        class ToyConfig(Section):
            enabled: Bool = True
            factor: PositiveInt = 2
        """,
    "tasks.py": """
        def count_task(item: dict, factor: int) -> dict:
            return {"part": item["part"], "counted": item["part"] * factor}
        """,
    "stage.py": """
        import functools

        from gristmill.pipeline.stages import Stage, StageResult

        from . import tasks
        from .config import ToyConfig


        class Toy(Stage):
            name, section, config, default = "toy", "toy", ToyConfig, None  # absent: off

            def __init__(self, cfg: ToyConfig):
                self.cfg = cfg

            def run(self, ctx) -> StageResult:
                out = ctx.runner.run(self.name, ctx.per_partition(), functools.partial(tasks.count_task, factor=self.cfg.factor))
                return StageResult(self.name, rows={self.name: {"counted": sum(o["counted"] for o in out)}})
        """,
}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy stage's class, imported from its folder in tmp_path (a package of its own)."""
    pkg = tmp_path / "src" / "toy_stage"
    pkg.mkdir(parents=True)
    for name, text in TOY.items():
        (pkg / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield importlib.import_module("toy_stage.stage").Toy
    for mod in [m for m in sys.modules if m == "toy_stage" or m.startswith("toy_stage.")]:
        del sys.modules[mod]


def test_a_new_stage_is_one_folder_and_one_line(tmp_path, toy):
    from gristmill.pipeline.runner import SerialRunner
    from gristmill.pipeline.workdir import WorkDir

    with_toy = (*STAGES[:3], toy, *STAGES[3:])  # the one line: after exact dedup, before quality
    model = job_model(with_toy)
    fields = list(model.model_fields)
    assert fields.index("exact_dedup") + 1 == fields.index("toy") == fields.index("quality") - 1
    base = {"inputs": ["unused.jsonl"], "output": {"store": str(tmp_path / "s"), "dataset": "d"}, "work_dir": str(tmp_path / "w")}

    job = model.from_dict({**base, "toy": {"factor": 3}})  # its section is validated with the job
    assert job.toy.factor == 3 and job.content_dict()["toy"] == {"enabled": True, "factor": 3}
    with pytest.raises(ConfigError, match=r"^toy\.factor: expected an integer >= 1, got 0$"):
        model.from_dict({**base, "toy": {"factor": 0}})
    with pytest.raises(ConfigError, match=r"^toy\.factr: expected one of the keys enabled, factor, got unknown key 'factr'; did you mean 'factor'\?$"):
        model.from_dict({**base, "toy": {"factr": 3}})

    built = stages.build(job, with_toy)  # it runs in its place
    names = [s.name for s in built]
    assert names.index("exact_dedup") + 1 == names.index("toy")
    assert [s.name for s in stages.build(model.from_dict(base), with_toy)] == [s.name for s in stages.build(PrepareConfig.from_dict(base))]
    assert [s.name for s in stages.build(model.from_dict({**base, "toy": {"enabled": False}}), with_toy)].count("toy") == 0

    wd = WorkDir(str(tmp_path / "w"))
    ctx = stages.Context(wd, SerialRunner(wd), [Partition(p, ()) for p in range(3)])
    result = ctx.run(next(s for s in built if s.name == "toy"))  # its tasks run through the runner
    assert result.rows == {"toy": {"counted": (0 + 1 + 2) * 3}}

    # without the line, the job has no toy section: the key is refused
    assert "toy" not in PrepareConfig.model_fields and "toy" not in job_model(STAGES).model_fields
    with pytest.raises(ConfigError, match="got unknown key 'toy'"):
        PrepareConfig.from_dict({**base, "toy": {"factor": 3}})


def test_the_derived_job_is_the_job_model_pickled_by_reference():
    """Ray and the local runner's workers receive the job: the derived class is a module attribute."""
    import pickle

    assert PrepareConfig.__module__ == "gristmill.pipeline.config" and PrepareConfig.__name__ == "PrepareConfig"
    assert pickle.loads(pickle.dumps(PrepareConfig)) is PrepareConfig
