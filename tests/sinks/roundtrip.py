"""Log two steps through a rollwire metrics sink, then read them back with the library itself.

Run by test_sinks.py in a network namespace with only loopback up (these libraries can phone
home). Prints JSON: what was logged and what the library's own reader found.
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path
from typing import Any

from rollwire.metrics_sinks import make_sink, step_metrics
from rollwire.testing.chat_samples import CHAR_TOKENIZER, chat_batch
from rollwire.testing.samples import sample_batch


def read_tensorboard(where: Path, names: list[str]) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(where), size_guidance={"tensors": 0})
    acc.Reload()
    out: dict[str, dict[str, float]] = {}
    for name in acc.Tags()["tensors"]:
        for e in acc.Tensors(name):
            out.setdefault(str(e.step), {})[name] = float(tensor_util.make_ndarray(e.tensor_proto))
    return {"steps": out, "tags": json.loads((where / "tags.json").read_text())}


def read_mlflow(uri: str, run_id: str, names: list[str]) -> dict[str, Any]:
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in, as the sink does
    client = MlflowClient(tracking_uri=uri)
    out: dict[str, dict[str, float]] = {}
    for name in names:
        for m in client.get_metric_history(run_id, name):
            out.setdefault(str(m.step), {})[name] = m.value
    run = client.get_run(run_id)
    return {
        "steps": out,
        "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")},
        "status": run.info.status,
    }


def read_wandb(where: Path) -> dict[str, Any]:
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    (file,) = glob.glob(str(where / "wandb" / "offline-run-*" / "run-*.wandb"))
    ds = datastore.DataStore()
    ds.open_for_scan(file)
    out: dict[str, dict[str, float]] = {}
    tags: dict[str, str] = {}
    while (data := ds.scan_data()) is not None:
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item
            }
            step = str(rec.history.step.num)
            out[step] = {k: float(v) for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            for i in rec.summary.update:
                key = i.key or "/".join(i.nested_key)
                if not key.startswith("_"):
                    tags[key] = json.loads(i.value_json)
    return {"steps": out, "tags": tags}


def write(kind: str, where: Path) -> dict[str, Any]:
    sink = make_sink(f"{kind}:{where}")
    logged = {
        "0": step_metrics(chat_batch(), tokenizer=CHAR_TOKENIZER, wall_s=2.0),
        "1": step_metrics(sample_batch(), wall_s=1.0),
    }
    for step, metrics in logged.items():
        sink.log(metrics, int(step))
    sink.set_tags({"policy_version": "v3"})
    sink.close()
    ref = {"uri": getattr(sink, "tracking_uri", ""), "run_id": getattr(sink, "run_id", "")}
    return {"logged": logged, "ref": ref}


def read(kind: str, where: Path, ref: dict[str, str], names: list[str]) -> dict[str, Any]:
    if kind == "tensorboard":
        return read_tensorboard(where, names)
    if kind == "mlflow":
        return read_mlflow(ref["uri"], ref["run_id"], names)
    return read_wandb(where)


def main() -> None:
    """``write KIND DIR`` logs and prints what it logged; ``read KIND DIR REF`` reads it back
    in a fresh process, after the writer has exited."""
    verb, kind, where = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if verb == "write":
        print(json.dumps(write(kind, where)))
    else:
        arg = json.loads(sys.argv[4])
        print(json.dumps(read(kind, where, arg["ref"], arg["names"])))


if __name__ == "__main__":
    main()
