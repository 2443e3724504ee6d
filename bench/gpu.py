"""The GPU smoke test (issue 45): one command for the first machine with TensorFlow on a GPU.

It prints the devices, checks each row of issue 45 (F1 to F12) that the machine
can tell, and trains a few steps of both families (DeepSpeech, the Conformer) in
float32, ``mixed_float16`` and ``mixed_bfloat16``, without and with XLA, on one
device and on all, each through the real Train stage on ``configs/sample.yaml``'s
corpus. The last line is one JSON object:

- ``devices``; ``checks``: ``F1`` to ``F12``, each ``pass``, ``fail`` or
  ``skipped`` (only a GPU can tell, or a test checks it on the CPU), and
  ``check_details`` saying what was looked at;
- ``runs``: per configuration, audio seconds trained per second (after the first
  step), XLA compiles of the step (counted in XLA's own dump), the traced forward
  and backward pass's op count, the one-device step's ops outside XLA (F4), peak
  GPU memory, the last loss, or the error;
- ``shapes_per_epoch``: distinct padded batch shapes of an epoch of the sample's
  training split with ``training.bucket_growth: 1.1`` (F9);
- ``input_mb_per_s``: the input pipeline's read rate with its default readers (F11).

At full size (``--steps 200``) the models are ``configs/en.yaml``'s and
``configs/en-conformer.yaml``'s geometry. ``--dry-run`` runs the same plumbing on
the CPU (split into 2 logical devices, tiny models, 2 steps a run), in about 9 minutes
on 2 cores; without a GPU and without ``--dry-run`` it stops and says so.

    python bench/gpu.py [--dry-run] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
FAMILIES = ("deepspeech", "conformer")
GROWTH = 1.1  # training.bucket_growth of the runs and of shapes_per_epoch
DRY_GEOMETRY = {
    "deepspeech": {"deepspeech": {"n_hidden": 64, "dropout_rate": 0.0}},
    "conformer": {
        "architecture": "conformer",
        "conformer": {"d_model": 32, "heads": 2, "layers": 2, "conv_kernel": 5, "subsampling_channels": 8}
        | {"subsampling": 2},
    },
}


def _recipe(family: str, dry_run: bool) -> dict:
    """The ``model`` (and ``features``) sections of a run: a tiny model on the sample's front end in a
    dry run, else the full-size config's model and front end (the Conformer's 4x subsampling needs its
    10 ms frames: on the sample's 20 ms ones no utterance keeps an output per label)."""
    if dry_run:
        return {"model": DRY_GEOMETRY[family], "features": {"workers": 1}}
    import yaml

    name = "en.yaml" if family == "deepspeech" else "en-conformer.yaml"
    recipe = yaml.safe_load((ROOT / "configs" / name).read_text())
    return {"model": recipe["model"], "features": recipe.get("features", {})}


def run_config(
    work: Path, family: str, precision: str, xla: bool, towers: int, args, exact=False, epochs=1
) -> object:
    """The config of one training run: ``args.steps`` steps on ``towers`` devices, validation off;
    ``exact``: ``training.deterministic: exact`` (else ``auto``, or ``exact`` with ``--exact``)."""
    from pipeline.config_loader import load_config

    batch = 4 if args.dry_run else 16
    distribution = {"strategy": "one_device"} if towers == 1 else {"strategy": "mirrored"}
    if args.dry_run and towers > 1:
        distribution["cpu_devices"] = towers
    return load_config(
        ROOT / "configs" / "sample.yaml",
        {
            "paths": {"work_dir": str(work)},
            "data": {"limit_train": args.steps * batch * towers, "limit_dev": 4, "limit_test": 4},
            **_recipe(family, args.dry_run),
            "training": {
                "epochs": epochs,
                "batch_size": batch,
                "validation_epochs": 0,
                "checkpoint_secs": 10**6,
                "precision": precision,
                "jit_compile": xla,
                # a dry run's few steps in one or two shapes: XLA compiles slowly on a CPU
                "bucket_growth": 2.0 if args.dry_run else GROWTH,
                "deterministic": "exact" if exact or args.exact else "auto",
            },
            "early_stop": {"rule": "off"},
            "augment": {"speed_factors": []},
            "distribution": distribution,
        },
    )


def compiled_steps(dump: Path) -> set[str]:
    """The XLA modules of the step compiled so far (one per shape): the whole step's on one device, the
    forward and backward pass's across devices."""
    return {
        p.name.split(".")[0]
        for pattern in ("*gradients*", "*replica_step*", "*replica_add*")
        for p in dump.glob(pattern + ".before_optimizations.txt")
    }


def _batch_spec(n_input: int) -> tuple:
    """One task's batch as the step takes it: features, their lengths, labels, their lengths, indices."""
    import tensorflow as tf

    return (
        tf.TensorSpec([None, None, n_input], tf.float32),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None], tf.int64),
    )


def step_ops(config, n_input: int, n_classes: int) -> int:
    """Nodes of the step's traced forward and backward pass (its called functions included)."""
    import keras
    import tensorflow as tf

    from pipeline.model import build_model
    from pipeline.model.heads import OneTask
    from pipeline.train.step import task_gradients

    model = OneTask(
        build_model(
            config.model, n_input, n_classes, config.training.precision, config.features.normalize == "global"
        )
    )
    step = task_gradients(model, (0,), [n_classes - 1], keras.optimizers.Adam(), config.training)
    step = step if hasattr(step, "get_concrete_function") else tf.function(step)
    graph = step.get_concrete_function((_batch_spec(n_input),), tf.TensorSpec([1], tf.float32))
    graph = graph.graph.as_graph_def()
    return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)


def step_ops_outside_xla(config, n_input: int, n_classes: int) -> int:
    """Ops of one device's traced training step (forward, backward and update) that run one at a time,
    outside XLA: on a GPU most of them a kernel launch each (issue 45 F4)."""
    from dataclasses import replace

    from pipeline.model import build_model
    from pipeline.model.heads import OneTask
    from pipeline.train.distribute import make_strategy
    from pipeline.train.graph_ops import ops_outside_xla
    from pipeline.train.optimizer import optimizers
    from pipeline.train.step import TrainingStep

    strategy = make_strategy(replace(config.distribution, strategy="one_device"))
    with strategy.scope():
        model = OneTask(
            build_model(
                config.model,
                n_input,
                n_classes,
                config.training.precision,
                config.features.normalize == "global",
            )
        )
        adam, applies, _ = optimizers(config.training, model.trainable_variables)
    training = replace(config.training, accumulate_batches=1)
    step = TrainingStep(model, [1.0], [n_classes - 1], adam, applies, strategy, training, 1)
    return ops_outside_xla(step.traced_graph("step", (0,), (_batch_spec(n_input),)))


def parent_run(spec: dict, args) -> dict:
    """One run in a process of its own (the collective instances of one process's strategies collide
    across models, and XLA reads its flags once): its row, or its error's last line."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--run",
        json.dumps(spec),
        "--steps",
        str(args.steps),
    ]
    command += ["--dry-run"] if args.dry_run else []
    command += ["--exact"] if args.exact else []
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={spec['work']}/xla"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    except subprocess.TimeoutExpired:
        return {"error": "no answer within an hour"}
    for line in done.stdout.splitlines():
        if line.startswith("RUN "):
            return json.loads(line[4:])
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {done.returncode}: {last[:300]}"}


def child_run(spec: dict, args) -> int:
    """The child's run: train ``spec`` through the Train stage, print ``RUN`` and its row."""
    import tensorflow as tf

    from pipeline.layout import Layout
    from pipeline.stages.features import features_stage
    from pipeline.stages.outputs import split_cache
    from pipeline.stages.train import train_stage
    from pipeline.train.hooks import TrainHooks

    work = Path(spec["work"])
    config = run_config(
        work, spec["family"], spec["precision"], spec["xla"], spec["towers"], args, spec.get("exact", False)
    )
    layout = Layout(config)
    for split in ("train", "dev"):
        features_stage(layout, split)
    # Enough epochs of the (small) training split for the steps asked for; epochs is in no fingerprint.
    train = split_cache(layout, "train")
    per_epoch = -(-len(train) // (config.training.batch_size * spec["towers"]))
    epochs = -(-args.steps // per_epoch)
    config = run_config(
        work, spec["family"], spec["precision"], spec["xla"], spec["towers"], args, spec.get("exact"), epochs
    )
    layout = Layout(config)
    gpus = tf.config.list_physical_devices("GPU")
    marks: list[tuple[int, float]] = []
    reductions: list[int] = []
    if spec.get("count_reductions"):
        reduce = tf.distribute.ReplicaContext.all_reduce

        def counted(self, op, value, options=None):
            reductions.append(len(tf.nest.flatten(value)))
            return reduce(self, op, value, options)

        tf.distribute.ReplicaContext.all_reduce = counted
    try:
        report = train_stage(
            layout, hooks=TrainHooks(on_step=lambda info: marks.append((info.epoch, time.perf_counter())))
        )
    except Exception as error:  # a configuration this machine cannot run: its line, the others go on
        _answer({"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"})
    row = {
        "steps": report.global_step,
        "audio_s_per_s": _rate(marks, report.train_audio_hours * 3600),
        "compiles": len(compiled_steps(work / "xla")),
        # the same graph on every tower count: traced in the one-device run only (the parent copies it)
        "forward_backward_ops": step_ops(config, train.n_input, 29) if spec["towers"] == 1 else None,
        "step_ops_outside_xla": step_ops_outside_xla(config, train.n_input, 29)
        if spec["towers"] == 1
        else None,
        "peak_gpu_mb": round(tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20)
        if gpus
        else None,
        "last_loss": round(report.train_losses[-1]["train_loss"], 3) if report.train_losses else None,
        "weights_sha256": report.weights_sha256,
    }
    if spec.get("count_reductions"):
        row["reductions"] = reductions
    _answer(row)


def _answer(row: dict) -> None:
    """The child's last act: ``RUN`` and its row (non-finite numbers as null), then exit at once (a
    strategy's or an iterator's teardown can hang a process whose run is over)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
    print("RUN " + json.dumps(clean, allow_nan=False), flush=True)
    os._exit(0)


def _rate(marks: list[tuple[int, float]], epoch_audio_s: float) -> float | None:
    """Audio seconds trained per second: over the epochs after the first (their shapes compiled and
    tuned already), else over the steps after the first; None with fewer than 2 steps."""
    if len(marks) < 2:
        return None
    epochs = sorted({epoch for epoch, _ in marks})
    if len(epochs) > 1:
        start = max(t for epoch, t in marks if epoch == epochs[0])
        return round(epoch_audio_s * (len(epochs) - 1) / (marks[-1][1] - start), 1)
    return round(epoch_audio_s * (len(marks) - 1) / len(marks) / (marks[-1][1] - marks[0][1]), 1)


def two_workers_agree() -> tuple[str, str]:
    """F7: two worker processes on 127.0.0.1 whose own verdicts differ end with the chief's."""
    from pipeline.train.multiworker import free_ports

    script = (
        "import json, os, sys\nimport tensorflow as tf\n"
        "from pipeline.train.agreement import chiefs_verdict\n"
        "from pipeline.train.distribute import ClusterRole\n"
        "from pipeline.train.policy import EpochVerdict\n"
        "index = int(sys.argv[1])\nstrategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
        "mine = EpochVerdict(is_best=index == 0, halve_lr=index == 1)\n"
        "agreed = chiefs_verdict(strategy, ClusterRole(index, 2), mine, 1)\n"
        "print('AGREED', agreed.is_best, agreed.halve_lr)\n"
    )
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    workers = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        env = {**os.environ, "TF_CONFIG": tf_config, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
        env.pop("XLA_FLAGS", None)
        workers.append(
            subprocess.Popen(
                [sys.executable, "-c", script, str(index)], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    try:
        lines = [w.communicate(timeout=300)[0] for w in workers]
    except subprocess.TimeoutExpired:
        for worker in workers:
            worker.kill()
        return "fail", "the two workers did not finish within 5 minutes"
    agreed = [next((ln for ln in out.splitlines() if ln.startswith("AGREED")), "none") for out in lines]
    ok = agreed == ["AGREED True False"] * 2
    return ("pass" if ok else "fail"), f"worker 0 (chief) best, worker 1 halving: both got {agreed}"


def _traced_ops(function, spec) -> set[str]:
    """Op types of ``function`` traced for ``spec``, its called functions included."""
    graph = function.get_concrete_function(spec).graph.as_graph_def()
    return {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}


def lstm_checks(gpus: list) -> dict[str, tuple[str, str]]:
    """F1, F3, F12: which LSTM kernel the training step, the XLA step and the export form trace."""
    import tensorflow as tf

    from pipeline.config_loader import config_from_dict
    from pipeline.model import build_model, model_family
    from pipeline.model.deepspeech_net import uses_fused_lstm

    config = config_from_dict({"model": DRY_GEOMETRY["deepspeech"]}).model
    model, family = build_model(config, 26, 29), model_family(config.architecture)
    spec = tf.TensorSpec([1, None, 26], tf.float32)
    plain = _traced_ops(tf.function(lambda x: model(x, training=True)), spec)
    jit = _traced_ops(tf.function(lambda x: model(x, training=True), jit_compile=True), spec)
    export = _traced_ops(tf.function(lambda x: family.utterance(model, x)), spec)
    cudnn = lambda ops: any(op.startswith("CudnnRNN") for op in ops)  # noqa: E731
    f1 = not cudnn(jit) and (cudnn(plain) if gpus else True)
    return {
        "F1": (
            "pass" if f1 else "fail",
            f"cuDNN's LSTM in the plain step: {cudnn(plain)}, under XLA: {cudnn(jit)}"
            + (
                ""
                if gpus
                else " (no GPU: Keras traces its generic LSTM; the GPU case is test_fused_lstm.py's)"
            ),
        ),
        "F3": (
            "pass" if uses_fused_lstm("auto", "mixed_bfloat16", gpu=True) else "fail",
            "lstm_kernel auto takes the fused LSTM for mixed_bfloat16 where a GPU is visible; the bf16 runs "
            "say whether it trains",
        ),
        "F12": (
            "pass" if not cudnn(export) else "fail",
            f"cuDNN's LSTM in the export's form: {cudnn(export)}",
        ),
    }


def main(argv=None) -> int:
    """Check, train (each run in a process of its own), print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: the same plumbing on the CPU")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 200; 2 dry)")
    parser.add_argument("--exact", action="store_true", help="training.deterministic: exact in every run")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (runs, XLA dumps)")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one run, in the child process
    args = parser.parse_args(argv)
    args.steps = args.steps or (2 if args.dry_run else 200)
    if args.run:
        return child_run(json.loads(args.run), args)
    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    import tensorflow as tf

    from pipeline.model.ctc import KERNEL, LOG_SPACE, ctc_implementation
    from pipeline.train.distribute import collective_implementation

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.dry_run:
        print(
            "bench/gpu.py: no GPU visible to TensorFlow; run with --dry-run to check the plumbing on the CPU"
        )
        return 2
    devices = [d.name for d in tf.config.list_physical_devices()]
    towers = (1, len(gpus)) if len(gpus) > 1 else (1,) if gpus else (1, 2)
    print("devices:", ", ".join(devices), flush=True)

    def run(name: str, **spec) -> dict:
        row = {k: spec[k] for k in ("family", "precision", "xla", "towers")}
        row |= parent_run({**spec, "work": str(work / name)}, args)
        print(json.dumps(row), flush=True)
        return row

    runs = [
        run(f"{family}-{precision}-{xla}-{count}", family=family, precision=precision, xla=xla, towers=count)
        for family in FAMILIES
        for precision in PRECISIONS
        for xla in (False, True)
        for count in towers
    ]
    for row in runs:
        if row.get("forward_backward_ops", 0) is None:
            key = (row["family"], row["precision"], row["xla"], 1)
            ops = next(r for r in runs if (r["family"], r["precision"], r["xla"], r["towers"]) == key)
            row["forward_backward_ops"] = ops.get("forward_backward_ops")
    spec = {"family": "deepspeech", "precision": "float32", "xla": False}
    reductions = (
        run("reductions", **spec, towers=towers[-1], count_reductions=True).get("reductions", [])
        if len(towers) > 1
        else []
    )
    exact = [run(f"exact-{i}", **spec, towers=1, exact=True) for i in range(2)]
    trained = lambda **kw: [r for r in runs if all(r[k] == v for k, v in kw.items())]  # noqa: E731
    fine = lambda rows: bool(rows) and all("error" not in r for r in rows)  # noqa: E731
    checks: dict[str, tuple[str, str]] = {}
    found: dict = {}

    def check(row: str, judge) -> None:
        """``judge()`` -> (status, detail) for ``row``; an exception fails the row with its line."""
        try:
            checks[row] = judge()
        except Exception as error:
            checks[row] = (
                "fail",
                f"the check raised {type(error).__name__}: {str(error).splitlines()[0][:200]}",
            )

    def lstm():
        checks.update(lstm_checks(gpus))
        return checks["F1"]

    def ctc():
        choice = ctc_implementation(False) == KERNEL and ctc_implementation(True) == LOG_SPACE
        return (
            "pass" if choice and fine(trained(xla=True)) else "fail",
            "TensorFlow's CTC kernel outside XLA, the log-space loss inside, and every XLA run trained; the "
            "kernel's placement on the host CPU is test_ctc.py's; its cost: the rows with and without XLA",
        )

    def bf16():
        status, detail = checks["F3"]
        if not fine(trained(family="deepspeech", precision="mixed_bfloat16")):
            return "fail", "a DeepSpeech mixed_bfloat16 run failed; " + detail
        return status, detail

    def one_all_reduce():
        weights = _deepspeech_weights(run_config(work / "weights", "deepspeech", "float32", False, 1, args))
        carrying = [size for size in reductions if size >= weights]
        return (
            "pass" if carrying == [weights + 2] * towers[-1] else "fail",
            f"all-reduces carrying the {weights} gradients in the traced {towers[-1]}-tower step: {carrying} "
            f"(one per tower: the gradients, the loss and the vote)",
        )

    def shapes():
        found["shapes"] = shapes_per_epoch(work / "sample")
        return "pass" if found[
            "shapes"
        ] <= 64 else "fail", f"{found['shapes']} shapes in an epoch (at most 64)"

    def exact_runs():
        same = fine(exact) and len({r.get("weights_sha256") for r in exact}) == 1
        return (
            "pass" if same else "fail",
            f"two runs with training.deterministic: exact end with {'the same' if same else 'other'} weights",
        )

    def feed():
        found["feed"] = input_rate(work / "sample")
        rates = [r["audio_s_per_s"] for r in runs if "error" not in r and r.get("audio_s_per_s")]
        if not rates:
            return "fail", "no run trained, so no rate to compare the input with"
        return (
            "pass" if found["feed"]["audio_s_per_s"] >= max(rates) else "fail",
            f"the input gives {found['feed']['audio_s_per_s']} audio s/s in one process; the fastest run "
            f"took {max(rates):.0f} (all its towers); on paper 8 H100s in bf16 take 71,464",
        )

    check("F1", lstm)
    check("F2", ctc)
    if "F3" in checks:
        check("F3", bf16)

    def update_compiled():
        outside = {
            (r["family"], r["precision"], r["xla"]): r.get("step_ops_outside_xla")
            for r in runs
            if r["towers"] == 1 and "error" not in r
        }
        pairs = {
            (family, precision): (outside[family, precision, False], outside[family, precision, True])
            for family, precision, xla in outside
            if xla and (family, precision, False) in outside
        }
        failed = [f"{r['family']} {r['precision']}" for r in trained(xla=True, towers=1) if "error" in r]
        if failed:
            return "fail", f"one-device XLA runs failed: {', '.join(failed)}"
        if not pairs:
            return "fail", "no one-device run trained both without and with XLA"
        fewer = all(compiled is not None and 20 * compiled < plain for plain, compiled in pairs.values())
        counts = ", ".join(f"{f} {p}: {a} -> {b}" for (f, p), (a, b) in sorted(pairs.items()))
        return (
            "pass" if fewer else "fail",
            f"traced ops of one device's step outside XLA, without -> with jit_compile: {counts} (across "
            "towers the update is not compiled: test_xla_update.py)",
        )

    check("F4", update_compiled)
    if len(towers) > 1:
        check("F5", one_all_reduce)
    else:
        checks["F5"] = ("skipped", "one device: nothing to all-reduce")
    checks["F6"] = (
        "skipped",
        f"NCCL needs GPUs in several worker processes; the choice here would be "
        f"{collective_implementation(bool(gpus)).name} (test_multiworker.py); a dead or stopped worker is "
        f"found by TensorFlow's coordination-service heartbeat (test_multiworker.py, on the CPU), one hung "
        f"with its heartbeat alive by the collective timeout only",
    )
    check("F7", two_workers_agree)
    checks["F8"] = ("skipped", "test_precision.py injects the overflow on the CPU; nothing here can")
    check("F9", shapes)
    check("F10", exact_runs)
    check("F11", feed)
    for row in ("F1", "F3", "F12"):
        checks.setdefault(row, ("fail", "the LSTM check did not run"))
        if not gpus and checks[row][0] == "pass":  # Keras traces no cuDNN kernel without a GPU
            checks[row] = ("skipped", "no GPU: " + checks[row][1])
    order = sorted(checks, key=lambda k: int(k[1:]))
    result = {
        "devices": devices,
        "checks": {k: checks[k][0] for k in order},
        "check_details": {k: checks[k][1] for k in order},
        "runs": runs,
        "shapes_per_epoch": found.get("shapes"),
        "input_mb_per_s": found.get("feed", {}).get("mb_per_s"),
    }
    print(json.dumps(result, allow_nan=False))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _deepspeech_weights(config) -> int:
    """The number of DeepSpeech's trainable variables at ``config``'s geometry."""
    from pipeline.model import build_model

    return len(build_model(config.model, 26, 29).trainable_variables)


def shapes_per_epoch(work: Path) -> int:
    """F9: the distinct padded (batch, frames, labels) shapes of an epoch of the sample's training split
    with ``training.bucket_growth`` ``GROWTH``, at its batch size."""
    from input import sample_split  # bench/input.py, beside this script

    from pipeline.batches.buckets import shape_grid
    from pipeline.batches.dataset import batch_plan

    config, index = sample_split(work)
    grid = shape_grid(index, GROWTH)
    plan = batch_plan(index.lengths, config.training.batch_size, 1, grid=grid)
    longest = [int(index.lengths[b].max()) for b in plan]
    return len({(len(b), grid.frames(n), grid.labels(n)) for b, n in zip(plan, longest, strict=True)})


def input_rate(work: Path) -> dict:
    """F11: ``bench/input.py``'s rate of the sample's training split with the default readers."""
    from input import reader_rate, sample_split  # bench/input.py, beside this script

    from pipeline.batches.dataset import PARALLEL_BATCHES

    config, index = sample_split(work)
    return reader_rate(index, config.training.batch_size, PARALLEL_BATCHES, 0.0)


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
