"""The one map of the work directory: fingerprints, paths, and what answering complete() costs."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

import pipeline.digests as digests_module
from pipeline.config_loader import config_from_dict, load_config
from pipeline.dag import SPLITS
from pipeline.layout import Layout
from tests.conftest import ROOT, SAMPLE

# Names of stage files and folders: only pipeline/workdir.py may spell them (native_client/metadata.py
# defines the client's metadata.json, the one name a client must know before it has read anything).
STAGE_FILES = (
    "train_report.json",
    "lm_report.json",
    "tune.json",
    "evaluation.json",
    "evaluation.txt",
    "metadata.json",
    "lm.arpa",
    "lm.binary",
    "chars.arpa",
    "vocab.txt",
    "model.tflite",
    "output_graph.pb",
    ".rejects.csv",
    ".parts",
    "config.yaml",
    "worker-",
    ".partial",
    ".staging",
)
# Stage folders, spelt as a path component (``x / "best"``).
STAGE_FOLDERS = re.compile(
    r'/\s*f?"(features|train|lm|tune|evaluate|export|checkpoints|best|summaries|logs|'
    r'transcripts|saved_model)"'
)


def _string_literals(path: Path):
    """(line, text) of every string constant in a module that is not a docstring."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_stage_file_name_is_spelt_outside_the_layout_module():
    allowed = {ROOT / "pipeline" / "workdir.py", ROOT / "native_client" / "metadata.py"}
    offences = []
    for folder in ("pipeline", "tasks", "native_client", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in allowed:
                continue
            for line, text in _string_literals(path):
                offences += [
                    f"{path.relative_to(ROOT)}:{line}: {name!r} in {text!r}"
                    for name in STAGE_FILES
                    if name in text
                ]
            offences += [
                f"{path.relative_to(ROOT)}: path component {m.group(0)!r}"
                for m in STAGE_FOLDERS.finditer(path.read_text())
            ]
    assert not offences, "\n".join(offences)


def test_fingerprints_of_existing_work_directories_are_kept():
    # Pinned for a config that names no files (manifest paths are absolute and would tie the values to
    # one checkout). These moved once, on purpose, with the streamed feature cache (format 2):
    # data.max_reject_fraction left the features fingerprint and data.max_duration_s joined it. The
    # LanguageModel fingerprint is the one the code before the layout object computed. All moved again
    # with issue 23 (languages): data.text normalises every manifest now (Features, LM, Export) and
    # model.output joined Features, LM and Train; and with issue 26 (data.max_duration_s 40 s by
    # default) and issue 24 (training.init_from's digest, export.coqui_tflite). And with issue 37:
    # features.resample and features.downmix became true by default (Features, and all that follows
    # it; a config that set both to true keeps its values).
    # lm_builder python kept its values when auto stopped being resolved by the tools on PATH (issue 42,
    # G3); auto, the default, moved then (LanguageModel and what follows it) and is pinned below. Train
    # and what follows it moved with issue 44 (normalisation in the model): DeepSpeech's settings hash as
    # model.options, as every family's do.
    config = config_from_dict(
        {
            "model": {"n_hidden": 100},
            "decoder": {"tune": True, "lm_order": 4, "lm_builder": "python"},
            "export": {"quantize": True},
        }
    )
    layout = Layout(config)
    assert [layout.features_fingerprint(split) for split in SPLITS] == [
        "fe2fc7805409",
        "64cb4a41b382",
        "14a4d21fa598",
    ]
    assert (
        layout.train_fingerprint,
        layout.lm_fingerprint,
        layout.tune_fingerprint,
        layout.evaluate_fingerprint,
        layout.export_fingerprint,
    ) == ("f53ee173b3d3", "f6942e09389a", "57c90f768d61", "95bc25eb845c", "a5e671a5844c")
    auto = Layout(
        config_from_dict(
            {
                "model": {"n_hidden": 100},
                "decoder": {"tune": True, "lm_order": 4},
                "export": {"quantize": True},
            }
        )
    )
    assert (auto.train_fingerprint, auto.lm_fingerprint, auto.tune_fingerprint) == (
        "f53ee173b3d3",
        "c727ab1db0a2",
        "ee2f6fe59059",
    )
    assert (auto.evaluate_fingerprint, auto.export_fingerprint) == ("16e42da60523", "76575e9f1dd2")


def test_an_lm_built_with_kenlm_has_its_own_fingerprint():
    python = Layout(config_from_dict({"decoder": {"lm_builder": "python"}}))
    kenlm = Layout(config_from_dict({"decoder": {"lm_builder": "kenlm"}}))
    pruned = Layout(config_from_dict({"decoder": {"lm_builder": "kenlm", "lm_prune": [0, 0, 1]}}))
    assert len({python.lm_fingerprint, kenlm.lm_fingerprint, pruned.lm_fingerprint}) == 3
    assert python.train_fingerprint == kenlm.train_fingerprint


def test_paths_come_from_one_place(write_config, tmp_path):
    config = load_config(write_config(f"paths:\n  work_dir: {tmp_path / 'w'}\n"))
    layout = Layout(config)
    assert layout.export_root == tmp_path / "w" / "export"
    assert (
        layout.train_run.report.parent
        == layout.train_run.root
        == tmp_path / "w" / "train" / layout.train_fingerprint
    )
    assert layout.rejects_report("dev").parent == layout.features_cache("dev").parent
    assert (
        layout.lm.report.parent == layout.lm.root
        and layout.lm.staging.name == layout.lm.root.name + ".partial"
    )
    assert layout.train_run.worker_scratch(1).checkpoints.parent.parent == layout.train_run.root


def test_a_changed_input_file_changes_the_fingerprint_and_nothing_is_stale(write_config, tmp_path):
    corpus = tmp_path / "lm.txt"
    corpus.write_text("in the beginning\n")
    path = write_config(f"paths:\n  work_dir: {tmp_path}\ndecoder:\n  lm_corpus_files: [{corpus}]\n")
    before = Layout(load_config(path)).lm_fingerprint
    corpus.write_text("in the beginning was the word\n")
    assert Layout(load_config(path)).lm_fingerprint != before


@pytest.mark.usefixtures("tasks_in_process")
def test_complete_on_the_whole_dag_reads_a_1_gb_lm_text_at_most_once(write_config, tmp_path, monkeypatch):
    from tasks import Evaluate, Export, Transcribe, TuneDecoder
    from tasks.rerun import dag

    big = tmp_path / "big-lm.txt"
    with open(big, "wb") as handle:  # sparse: 1 GB of text-to-be without using the disk
        handle.truncate(1 << 30)
    path = write_config(f"""
        extends: {ROOT / "configs" / "sample.yaml"}
        paths:
          work_dir: {tmp_path / "work"}
        decoder:
          lm_corpus_files: [{big}]
          tune: true
    """)
    reads: Counter = Counter()
    real = digests_module._hash_file

    def counting(file: Path) -> str:
        reads[Path(file)] += 1
        return real(file)

    monkeypatch.setattr(digests_module, "_hash_file", counting)
    digests_module._remembered_digest.cache_clear()
    roots = [
        Evaluate(config=str(path)),
        Export(config=str(path)),
        TuneDecoder(config=str(path)),
        Transcribe(config=str(path), audio=str(SAMPLE / "test" / "00001.flac")),
    ]
    for _ in range(2):
        tasks = dag(roots)
        assert len(tasks) == 9  # 3 feature splits, Train, LM, Tune, Evaluate, Export, Transcribe
        for task in tasks.values():
            assert not task.complete()
            task.output()
    assert reads[big.resolve()] == 1
    assert max(reads.values()) == 1, reads


def test_settings_that_change_no_result_keep_the_train_fingerprint():
    """Issue 26 L3: raising max_nonfinite_batches, another dev_batch_size or another cpu_devices (the
    checkpoint records the towers and refuses a mid-epoch resume on another batch plan) continue the same
    run; a setting that changes the model does not."""
    base = Layout(config_from_dict({})).train_fingerprint
    for section, key, value in (
        ("training", "max_nonfinite_batches", 50),
        ("training", "dev_batch_size", 64),
        ("distribution", "cpu_devices", 2),
    ):
        assert Layout(config_from_dict({section: {key: value}})).train_fingerprint == base, key
    assert Layout(config_from_dict({"training": {"batch_size": 8}})).train_fingerprint != base
    # Which checkpoint is the best one changes Train's output; the default leaves older runs where they are.
    assert Layout(config_from_dict({"training": {"best_by": "cer"}})).train_fingerprint != base
    assert Layout(config_from_dict({"training": {"best_by": "dev_loss"}})).train_fingerprint == base
    assert Layout(config_from_dict({"model": {"lstm_kernel": "layer"}})).train_fingerprint == base
    # Gradient aggregation changes the updates; left at 1 it moves no fingerprint.
    assert Layout(config_from_dict({"training": {"accumulate_batches": 1}})).train_fingerprint == base
    assert Layout(config_from_dict({"training": {"accumulate_batches": 2}})).train_fingerprint != base
    # The shape grid changes the shapes, dropout's draws and with a frame cap the batches; off (0), no
    # fingerprint moves.
    assert Layout(config_from_dict({"training": {"bucket_growth": 0}})).train_fingerprint == base
    assert Layout(config_from_dict({"training": {"bucket_growth": 1.1}})).train_fingerprint != base


def test_the_decoder_weights_and_an_init_from_checkpoint_are_in_their_fingerprints(tmp_path):
    """The rest of issue 26 L3, done before this round: TuneDecoder's search starts from lm_alpha/lm_beta,
    and a warm start is fingerprinted by its checkpoint's content, not its path."""
    base = Layout(config_from_dict({}))
    for key in ("lm_alpha", "lm_beta"):
        other = Layout(config_from_dict({"decoder": {key: 0.75}}))
        assert other.fingerprint("tune") != base.fingerprint("tune"), key
        assert other.train_fingerprint == base.train_fingerprint
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    (run / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    (run / "ckpt-1.index").write_bytes(b"index")
    (run / "ckpt-1.data-00000-of-00001").write_bytes(b"weights")
    warm = {"training": {"init_from": str(tmp_path / "run")}}
    before = Layout(config_from_dict(warm)).train_fingerprint
    (run / "ckpt-1.data-00000-of-00001").write_bytes(b"other weights")
    assert Layout(config_from_dict(warm)).train_fingerprint != before


def test_a_config_that_set_resample_and_downmix_keeps_its_fingerprints():
    """The new defaults (issue 37) move no fingerprint of a config that already asked for them."""
    explicit = {"features": {"resample": True, "downmix": True}}
    assert Layout(config_from_dict(explicit)).features_fingerprint("train") == Layout(
        config_from_dict({})
    ).features_fingerprint("train")
    refused = Layout(config_from_dict({"features": {"resample": False}}))
    assert refused.features_fingerprint("train") != Layout(config_from_dict({})).features_fingerprint("train")
