"""The table of bad inputs for tests/test_bad_inputs.py (issue 16): plan files, cluster
specs, profiles, command-line flags, model specs, special files and output paths.

A case is (name, command line, the regular expression its one stderr line must match,
the files to make). `{d}` is the case's own folder; it always holds `out.json`, a 0644
sentinel that must survive. File makers take `Base` (a good plan, spec, profile and HF
config as JSON objects) and return the file's content: an object (dumped as JSON,
NaN/Infinity written as Python's json writes them), text or bytes.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Base:
    plan: dict
    spec: dict
    profile: dict
    hf: dict


@dataclass(frozen=True)
class Bad:
    name: str
    command: str  # split on spaces; `{d}` is the case's folder
    want: str  # regex searched in the stderr line (`{d}` filled in, escaped)
    files: dict[str, Callable[[Base], Any]] = field(default_factory=dict)
    setup: Callable[[str], None] | None = None  # makes special files in the folder
    how: str = "inproc"  # "fork": in a child (may block); "nobody": a child without root
    limit_s: float = 10.0

    def __str__(self) -> str:
        return self.name


def edited(kind: str, change: Callable[[Any], Any]) -> Callable[[Base], Any]:
    """A maker: a deep copy of base.<kind> passed to `change`, which edits it in place or
    returns a replacement."""
    def make(base: Base):
        data = copy.deepcopy(getattr(base, kind))
        out = change(data)
        return data if out is None else out
    return make


def text(kind: str, change: Callable[[str], str]) -> Callable[[Base], str]:
    """A maker: base.<kind> as JSON text, then `change` on the text."""
    return lambda base: change(json.dumps(getattr(base, kind), indent=2))


def put(path: str, value) -> Callable[[Any], None]:
    """An edit: set the dotted/indexed path (`layers.0.tp`) to `value`."""
    *parents, last = path.split(".")

    def change(data):
        obj = data
        for key in parents:
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        if isinstance(obj, list):
            obj[int(last)] = value
        else:
            obj[last] = value
    return change


def drop(path: str) -> Callable[[Any], None]:
    *parents, last = path.split(".")

    def change(data):
        obj = data
        for key in parents:
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        del obj[last]
    return change


def plan(change) -> dict:
    return {"plan.json": edited("plan", change)}


def spec(change) -> dict:
    return {"spec.json": edited("spec", change)}


def profile(change) -> dict:
    return {"profile.json": edited("profile", change)}


def hf(maker) -> dict:
    return {"config.json": maker}


def rename_layer(index: int, name: str):
    def change(p):
        p["layers"][index]["name"] = name
    return change


def mkfifo(name: str):
    return lambda d: os.mkfifo(os.path.join(d, name))


def symlink_loop(name: str):
    return lambda d: os.symlink(name, os.path.join(d, name))


def huge(name: str, size: int = 300 * 2**20):
    def setup(d):
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(b'{"schema": "planner.plan/v1", "pad": "')
            fh.truncate(size)  # sparse: nothing is written
    return setup


def unreadable(name: str):
    def setup(d):
        path = os.path.join(d, name)
        with open(path, "w") as fh:
            fh.write("{}")
        os.chmod(path, 0)
    return setup


BIG = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000
SHOW = "show {d}/plan.json"
EST_PLAN = "estimate --plan {d}/plan.json"
PLAN_SPEC = "plan gpt-tiny --cluster {d}/spec.json --global-batch 8 --out {d}/out.json"
EST_PROFILE = "estimate gpt-tiny --cluster local --profile {d}/profile.json"
PLAN = "plan gpt-tiny --cluster local --gpus-per-node 2 --global-batch 8"
INSPECT = "inspect"
F = r"'{d}/plan.json'"  # how errors name the plan file
P = r"{d}/plan.json: "  # the prefix of errors about one key of the plan file
S = r"{d}/spec.json: "
R = r"{d}/profile.json"
NONFINITE = r"is not a number JSON allows; write a finite number"

PLAN_FILES = [
    Bad("plan-top-level-list", SHOW, P + r"top level: expected a JSON object, got a list",
        plan(lambda p: [p])),
    Bad("plan-unknown-schema", SHOW, P + r"schema: unknown schema version 'planner.plan/v9'",
        plan(put("schema", "planner.plan/v9"))),
    Bad("plan-schema-not-string", SHOW, P + r"schema: unknown schema version 1;",
        plan(put("schema", 1))),
    Bad("plan-missing-model", SHOW, P + r"model: missing; re-create it", plan(drop("model"))),
    Bad("plan-model-is-string", SHOW, P + r"model: expected a JSON object, got a string",
        plan(put("model", "gpt-tiny"))),
    Bad("plan-model-name-int", SHOW, P + r"model\.name: expected a string, got an integer 7",
        plan(put("model.name", 7))),
    Bad("plan-model-fingerprint-null", SHOW, P + r"model\.fingerprint: expected a string, got null",
        plan(put("model.fingerprint", None))),
    Bad("plan-num-microbatches-0", SHOW, P + r"num_microbatches: must be >= 1, got 0",
        plan(put("num_microbatches", 0))),
    Bad("plan-num-microbatches-negative", SHOW, P + r"num_microbatches: must be >= 1, got -4",
        plan(put("num_microbatches", -4))),
    Bad("plan-global-batch-string", SHOW, P + r"global_batch: expected an integer, got '8'",
        plan(put("global_batch", "8"))),
    Bad("plan-global-batch-float", SHOW, P + r"global_batch: expected an integer, got 8\.0",
        plan(put("global_batch", 8.0))),
    Bad("plan-global-batch-bool", SHOW, P + r"global_batch: expected an integer, got True",
        plan(put("global_batch", True))),
    Bad("plan-global-batch-huge", SHOW, P + r"global_batch: \d+ is out of range \(at most",
        plan(put("global_batch", 2**62))),
    Bad("plan-global-batch-5000-digits", SHOW,
        F + r": an integer of 5000 digits is out of range \(at most 19\)",
        {"plan.json": text("plan", lambda t: t.replace('"global_batch": 8', '"global_batch": ' + BIG))}),
    Bad("plan-global-batch-not-splitting", SHOW, P + r"plan: .*global batch 9 does not split",
        plan(put("global_batch", 9))),
    Bad("plan-micro-batch-0", SHOW, P + r"micro_batch: must be >= 1, got 0", plan(put("micro_batch", 0))),
    Bad("plan-world-size-negative", SHOW, P + r"world_size: must be >= 1, got -2",
        plan(put("world_size", -2))),
    Bad("plan-world-size-wrong", SHOW, P + r"world_size: 4 but the stages use 2 devices",
        plan(put("world_size", 4))),
    Bad("plan-tp-negative", SHOW, P + r"layers\[0\]\.tp: must be >= 1, got -2", plan(put("layers.0.tp", -2))),
    Bad("plan-tp-huge", SHOW, P + r"layers\[0\]\.tp: 1000000000000 is out of range",
        plan(put("layers.0.tp", 10**12))),
    Bad("plan-dp-zero", SHOW, P + r"layers\[1\]\.dp: must be >= 1, got 0", plan(put("layers.1.dp", 0))),
    Bad("plan-dp-mismatch", SHOW, P + r"plan: layer 2: tp=1 x dp=1 = 1 but stage 0 has 2 devices",
        plan(put("layers.2.dp", 1))),
    Bad("plan-stage-devices-zero", SHOW, P + r"stages\[0\]\.devices: must be >= 1, got 0",
        plan(put("stages.0.devices", 0))),
    Bad("plan-stage-devices-huge", SHOW, P + r"stages\[0\]\.devices: \d+ is out of range",
        plan(put("stages.0.devices", 10**15))),
    Bad("plan-stage-first-negative", SHOW, P + r"stages\[0\]\.first_layer: must be >= 0, got -1",
        plan(put("stages.0.first_layer", -1))),
    Bad("plan-stage-last-beyond", SHOW, P + r"stages\[0\]\.last_layer: 9999 is out of range",
        plan(put("stages.0.last_layer", 9999))),
    Bad("plan-stages-empty", SHOW, P + r"stages: must not be empty", plan(put("stages", []))),
    Bad("plan-layers-empty", SHOW, P + r"layers: must not be empty; re-create it",
        plan(put("layers", []))),
    Bad("plan-layers-object", SHOW, P + r"layers: expected a list, got an object",
        plan(put("layers", {"0": {}}))),
    Bad("plan-stage-is-string", SHOW, P + r"stages\[0\]: expected a JSON object, got a string",
        plan(put("stages.0", "all"))),
    Bad("plan-layer-is-null", SHOW, P + r"layers\[3\]: expected a JSON object, got null",
        plan(put("layers.3", None))),
    Bad("plan-nan", SHOW, F + r": NaN " + NONFINITE, plan(put("global_batch", float("nan")))),
    Bad("plan-infinity", SHOW, F + r": Infinity " + NONFINITE, plan(put("micro_batch", float("inf")))),
    Bad("plan-minus-infinity", SHOW, F + r": -Infinity " + NONFINITE,
        plan(put("predicted.mfu", float("-inf")))),
    Bad("plan-float-overflow", SHOW, F + r": 1e999 overflows a float",
        {"plan.json": text("plan", lambda t: t.replace('"global_batch": 8', '"global_batch": 1e999'))}),
    Bad("plan-100k-deep", SHOW, F + r" nests more than 64 levels deep, more than a JSON data file may have",
        {"plan.json": text("plan", lambda t: t.replace('"search": {', '"search": {"deep": ' + DEEP + ', ', 1))}),
    Bad("plan-duplicated-key", SHOW, F + r": key 'global_batch' appears twice in one object; keep one",
        {"plan.json": text("plan", lambda t: t.replace('"global_batch": 8', '"global_batch": 8, "global_batch": 16'))}),
    Bad("plan-extra-top-key", SHOW, P + r"colour: unknown key; a planner\.plan/v1 file has only",
        plan(put("colour", "blue"))),
    Bad("plan-extra-layer-key", SHOW, P + r"layers\[2\]\.tp_degree: unknown key",
        plan(put("layers.2.tp_degree", 2))),
    Bad("plan-extra-model-key", SHOW, P + r"model\.factory: unknown key", plan(put("model.factory", "os:system"))),
    Bad("plan-extra-stage-key", SHOW, P + r"stages\[0\]\.gpus: unknown key", plan(put("stages.0.gpus", 2))),
    Bad("plan-missing-dp-mode", SHOW, P + r"layers\[0\]\.dp_mode: missing", plan(drop("layers.0.dp_mode"))),
    Bad("plan-bad-dp-mode", SHOW, P + r"layers\[0\]\.dp_mode: 'zero9' is not one of replicate",
        plan(put("layers.0.dp_mode", "zero9"))),
    Bad("plan-bad-checkpoint", SHOW, P + r"layers\[1\]\.checkpoint: 'sometimes' is not one of",
        plan(put("layers.1.checkpoint", "sometimes"))),
    Bad("plan-sp-string", SHOW, P + r"layers\[1\]\.sequence_parallel: expected true or false, got a string",
        plan(put("layers.1.sequence_parallel", "yes"))),
    Bad("plan-sp-without-tp", SHOW, P + r"layers\[1\]: sequence_parallel needs tp > 1",
        plan(put("layers.1.sequence_parallel", True))),
    Bad("plan-bad-schedule", SHOW, P + r"schedule: 'zigzag' is not one of gpipe, 1f1b, interleaved: use "
        r"one of them", plan(put("schedule", "zigzag"))),
    Bad("plan-bad-precision", SHOW, P + r"precision: 'fp8' is not one of", plan(put("precision", "fp8"))),
    Bad("plan-bad-optimizer", SHOW, P + r"plan: unknown optimizer 'lion'; use one of adamw",
        plan(put("optimizer", "lion"))),
    Bad("plan-virtual-stages-0", SHOW, P + r"virtual_stages: must be >= 1, got 0",
        plan(put("virtual_stages", 0))),
    Bad("plan-num-layers-mismatch", SHOW, P + r"layers: \d+ entries but model\.num_layers is 99",
        plan(put("model.num_layers", 99))),
    Bad("plan-duplicated-stage-ranks", SHOW, P + r"stages\[0\]\.ranks: \[0, 0\] but the stage's "
        r"pipeline rank and device count gives \[0, 1\]; .*delete the key or re-create",
        plan(put("stages.0.ranks", [0, 0]))),
    Bad("plan-bogus-pipeline-groups", SHOW, P + r"pipeline_groups: \[\[0, 1\], \[7\]\] but",
        plan(put("pipeline_groups", [[0, 1], [7]]))),
    Bad("plan-bogus-tp-groups", SHOW, P + r"layers\[1\]\.tp_groups: \[\[0, 0\]\] but its tp",
        plan(put("layers.1.tp_groups", [[0, 0]]))),
    Bad("plan-bogus-dp-groups", SHOW, P + r"layers\[1\]\.dp_groups: \[\[1, 0\]\] but",
        plan(put("layers.1.dp_groups", [[1, 0]]))),
    Bad("plan-layer-stage-wrong", SHOW, P + r"layers\[1\]\.stage: 3 but the stages' layer ranges gives 0",
        plan(put("layers.1.stage", 3))),
    Bad("plan-layer-index-wrong", SHOW, P + r"layers\[1\]\.index: 7 but its position in the list gives 1",
        plan(put("layers.1.index", 7))),
    Bad("plan-renamed-first-layer", SHOW, P + r"stages\[0\]\.first_layer_name: 'embed' but "
        r"layers\[0\]\.name gives 'embedding'", plan(rename_layer(0, "embedding"))),
    Bad("plan-renamed-middle-layer", EST_PLAN, r"plan for gpt-tiny names its layers differently "
        r"from the model: it differs first at layer 2: 'blocks\.1' here, 'blocks\.one' in the "
        r"plan; the file was edited: re-plan", plan(rename_layer(2, "blocks.one"))),
    Bad("plan-predicted-text", SHOW, P + r"predicted\.iteration_seconds: expected a number, got 'fast'",
        plan(put("predicted.iteration_seconds", "fast"))),
    Bad("plan-predicted-format-code", SHOW, P + r"predicted\.mfu: expected a number, got '\{:>99999\}'",
        plan(put("predicted.mfu", "{:>99999}"))),
    Bad("plan-predicted-breakdown-text", SHOW,
        P + r"predicted\.memory\.stages\[0\]\.breakdown\.params: expected a number, got 'lots'",
        plan(put("predicted.memory.stages.0.breakdown.params", "lots"))),
    Bad("plan-predicted-host-bytes-null", SHOW,  # found by test_fuzz_inputs (2026-11-25)
        P + r"predicted\.memory\.stages\[0\]\.host_bytes: expected a number, got None",
        plan(put("predicted.memory.stages.0.host_bytes", None))),
    Bad("plan-predicted-memory-string", SHOW, P + r"predicted\.memory: expected a JSON object, got str",
        plan(put("predicted.memory", "a lot"))),
    Bad("plan-predicted-list", SHOW, P + r"predicted: expected a JSON object, got a list",
        plan(put("predicted", [1, 2]))),
    Bad("plan-search-list", SHOW, P + r"search: expected a JSON object, got a list", plan(put("search", []))),
    Bad("plan-cluster-list", SHOW, P + r"cluster: expected a JSON object, got a list", plan(put("cluster", []))),
    Bad("plan-seq-len-string", SHOW, P + r"model\.seq_len: expected a positive integer or null, got 'long'",
        plan(put("model.seq_len", "long"))),
    Bad("plan-seq-len-zero", SHOW, P + r"model\.seq_len: expected a positive integer or null, got 0",
        plan(put("model.seq_len", 0))),
    Bad("plan-spec-int", SHOW, P + r"model\.spec: expected a MODEL string or null, got 5",
        plan(put("model.spec", 5))),
    Bad("plan-graph-micro-batch-0", SHOW, P + r"model\.graph_micro_batch: must be >= 1, got 0",
        plan(put("model.graph_micro_batch", 0))),
    Bad("plan-control-chars-in-error", SHOW, P + r"schema: unknown schema version '\\x1b\[2J'",
        plan(put("schema", "\x1b[2J"))),
    Bad("plan-factory-spec", EST_PLAN, r"the plan names the factory 'tests\.factories:gpt_like', "
        r"which is code, and a plan file never runs code: pass the factory yourself",
        plan(put("model.spec", "tests.factories:gpt_like"))),
    Bad("plan-unknown-graph-dtype", EST_PLAN, r"plan records an unknown IR dtype 'float128' "
        r"\(model\.graph_dtype\); re-plan", plan(put("model.graph_dtype", "float128"))),
    Bad("plan-spec-hf-etc", EST_PLAN, r"hf config '/etc' is a folder, not a file",
        plan(put("model.spec", "hf:/etc"))),
    Bad("plan-spec-huge-model", EST_PLAN, r"model 'gpt:hidden=1e9': hidden=1e9 is out of range",
        plan(put("model.spec", "gpt:hidden=1e9"))),
    Bad("plan-cluster-invalid-for-estimate", EST_PLAN, P + r"cluster: .*intra_node_gbps must be a "
        r"number > 0, got -1.*; pass --cluster", plan(put("cluster.intra_node_gbps", -1))),
]

FILE_TYPES = [
    Bad("plan-malformed", SHOW, F + r" is not valid JSON \(malformed JSON at line 1, column 44: "
        r"Expecting ',' delimiter\); re-create it with `planner plan`",
        {"plan.json": lambda b: '{"schema": "planner.plan/v1", "model": [1,2}\n'}),
    Bad("plan-truncated", SHOW, F + r" is not valid JSON \(truncated JSON at line \d+",
        {"plan.json": text("plan", lambda t: t[:300])}),
    Bad("plan-empty-file", SHOW, F + r" is not valid JSON \(truncated JSON at line 1, column 1",
        {"plan.json": lambda b: ""}),
    Bad("plan-not-utf8", SHOW, F + r" is not UTF-8 text \(byte 11: b'\\xff'\)",
        {"plan.json": lambda b: b'{"schema": \xff}'}),
    Bad("plan-utf16", SHOW, F + r" is not UTF-8 text \(byte 0",
        {"plan.json": lambda b: json.dumps(b.plan).encode("utf-16")}),
    Bad("plan-huge-sparse-file", SHOW, F + r" is 300 MiB, over the 256 MiB a JSON data file may have",
        setup=huge("plan.json"), limit_s=2.0),
    Bad("plan-fifo", SHOW, F + r" is a FIFO \(named pipe\), not a regular file", setup=mkfifo("plan.json"),
        how="fork", limit_s=5.0),
    Bad("plan-dev-zero", "show /dev/zero", r"plan file '/dev/zero' is a character device, not a regular file",
        limit_s=2.0),
    Bad("plan-directory", "show {d}", r"plan file '{d}' is a folder, not a file; give the JSON file inside it"),
    Bad("plan-symlink-loop", SHOW, F + r" is a symlink loop; point the link at a real file",
        setup=symlink_loop("plan.json")),
    Bad("plan-broken-symlink", SHOW, r"cannot read plan file '{d}/plan\.json': it does not exist",
        setup=lambda d: os.symlink("nowhere.json", os.path.join(d, "plan.json"))),
    Bad("plan-missing", SHOW, r"cannot read plan file '{d}/plan\.json': it does not exist; write one"),
    Bad("plan-unreadable", SHOW, F + r" is not readable \(permission denied\); fix its permissions",
        setup=unreadable("plan.json"), how="nobody"),
    Bad("spec-fifo", PLAN_SPEC, r"cluster spec '{d}/spec\.json' is a FIFO", setup=mkfifo("spec.json"),
        how="fork", limit_s=5.0),
    Bad("spec-directory", "plan gpt-tiny --cluster {d}/dir.json --global-batch 8",
        r"cluster spec '{d}/dir\.json' is a folder", setup=lambda d: os.mkdir(os.path.join(d, "dir.json"))),
    Bad("profile-dev-zero", "estimate gpt-tiny --profile /dev/zero", r"profile '/dev/zero' is a character device"),
]

SPECS = [
    Bad("spec-not-utf8", PLAN_SPEC, r"cluster spec '{d}/spec\.json' is not UTF-8 text",
        {"spec.json": lambda b: json.dumps(b.spec).encode("latin-1").replace(b"a100", b"a\xe9100")}),
    Bad("spec-list", PLAN_SPEC, S + r"a cluster spec must be a JSON object, got list", spec(lambda s: [s])),
    Bad("spec-nan-bandwidth", PLAN_SPEC, r"cluster spec '{d}/spec\.json': NaN " + NONFINITE,
        spec(put("intra_node_gbps", float("nan")))),
    Bad("spec-negative-bandwidth", PLAN_SPEC, S + r"cluster \S+: intra_node_gbps must be a number > 0, got -300",
        spec(put("intra_node_gbps", -300.0))),
    Bad("spec-zero-bandwidth", PLAN_SPEC, S + r"cluster a100-80g: inter_node_gbps must be a number > 0, got 0",
        spec(put("inter_node_gbps", 0))),
    Bad("spec-string-bandwidth", PLAN_SPEC, S + r"field 'hbm_gbps' must be a number, got 'fast'",
        spec(put("hbm_gbps", "fast"))),
    Bad("spec-unknown-key", PLAN_SPEC, S + r"unknown field 'colour'; known fields: name", spec(put("colour", "red"))),
    Bad("spec-missing-key", PLAN_SPEC, S + r"missing field 'hbm_gbps'", spec(drop("hbm_gbps"))),
    Bad("spec-nodes-string", PLAN_SPEC, S + r"cluster a100-80g: num_nodes must be a positive integer, got 'two'",
        spec(put("num_nodes", "two"))),
    Bad("spec-nodes-huge", PLAN_SPEC, S + r"cluster a100-80g: 1000000000000 nodes x 8 devices is over 1,048,576 devices; give "
        r"realistic num_nodes",
        spec(put("num_nodes", 10**12))),
    Bad("spec-memory-zero", PLAN_SPEC, S + r"cluster a100-80g: device_memory_bytes must be a positive integer, got 0",
        spec(put("device_memory_bytes", 0))),
    Bad("spec-overhead-over-memory", PLAN_SPEC, S + r"cluster a100-80g: runtime_overhead_bytes \(\d+\) must be below",
        spec(put("runtime_overhead_bytes", 2**50))),
    Bad("spec-flops-list", PLAN_SPEC, S + r"field 'peak_flops_by_dtype' must be an object",
        spec(put("peak_flops_by_dtype", [1e15]))),
    Bad("spec-flops-negative", PLAN_SPEC, S + r"cluster a100-80g: peak_flops_by_dtype\[bfloat16\] must be a number > 0",
        spec(put("peak_flops_by_dtype", {"bfloat16": -1.0}))),
    Bad("spec-fits-not-list", PLAN_SPEC, S + r"field 'collective_fits' must be a list",
        spec(put("collective_fits", {}))),
    Bad("spec-fit-bad-collective", PLAN_SPEC, S + r"collective fit: unknown collective 'gossip'",
        spec(put("collective_fits", [{"collective": "gossip", "scope": "intra_node",
                                      "alpha_s": 1e-5, "bytes_per_s": 1e9}]))),
    Bad("spec-fit-alpha-string", PLAN_SPEC, S + r"field 'collective_fits\[0\]\.alpha_s' must be a number",
        spec(put("collective_fits", [{"collective": "all_reduce", "scope": "intra_node",
                                      "alpha_s": "small", "bytes_per_s": 1e9}]))),
    Bad("spec-fit-extra-key", PLAN_SPEC, S + r"collective_fits\[0\]: .*unexpected keyword argument 'colour'",
        spec(put("collective_fits", [{"collective": "all_reduce", "scope": "intra_node",
                                      "alpha_s": 1e-5, "bytes_per_s": 1e9, "colour": 1}]))),
    Bad("spec-overlap-2", PLAN_SPEC, S + r"cluster a100-80g: dp_overlap_efficiency must be in \[0, 1\], got 2",
        spec(put("dp_overlap_efficiency", 2))),
    Bad("spec-schema", PLAN_SPEC, S + r"schema 'planner\.cluster/v0' is not 'planner\.cluster/v1'",
        spec(put("schema", "planner.cluster/v0"))),
    Bad("spec-deep", PLAN_SPEC, r"cluster spec '{d}/spec\.json' nests more than 64 levels deep",
        {"spec.json": text("spec", lambda t: t.replace('"notes": ', '"notes": ' + DEEP + ', "x": ', 1))}),
    Bad("spec-calibration-string", PLAN_SPEC, S + r"field 'kernel_calibration' must be an object",
        spec(put("kernel_calibration", "fast"))),
    Bad("spec-tp-overhead-key", PLAN_SPEC, S + r"field 'tp_module_overhead_s': key 'two' is not a TP group size; use an integer",
        spec(put("tp_module_overhead_s", {"two": 0.001}))),
    Bad("spec-duplicated-key", PLAN_SPEC, r"cluster spec '{d}/spec\.json': key 'num_nodes' appears twice",
        {"spec.json": text("spec", lambda t: t.replace('"num_nodes": 1', '"num_nodes": 1, "num_nodes": 2'))}),
    Bad("spec-5000-digit", PLAN_SPEC, r"cluster spec '{d}/spec\.json': an integer of 5000 digits",
        {"spec.json": text("spec", lambda t: t.replace('"num_nodes": 1', '"num_nodes": ' + BIG))}),
]

PROFILES = [
    Bad("profile-schema", EST_PROFILE, R + r": schema is 'x', expected 'planner\.profile/v1'",
        profile(put("schema", "x"))),
    Bad("profile-list", EST_PROFILE, R + r": schema is None, expected", profile(lambda p: [p])),
    Bad("profile-nan", EST_PROFILE, r"profile '{d}/profile\.json': NaN " + NONFINITE,
        profile(put("layers.0.forward_seconds", float("nan")))),
    Bad("profile-nan-string", EST_PROFILE, R + r": layers\[0\]\.forward_seconds must be a finite number",
        profile(put("layers.0.forward_seconds", "nan"))),
    Bad("profile-negative", EST_PROFILE, R + r": layers\[0\]\.backward_seconds must be a finite number >= 0",
        profile(put("layers.0.backward_seconds", -1.0))),
    Bad("profile-missing-key", EST_PROFILE, R + r": layers\[0\] is missing or has a bad field",
        profile(drop("layers.0.backward_seconds"))),
    Bad("profile-not-utf8", EST_PROFILE, r"profile '{d}/profile\.json' is not UTF-8 text",
        {"profile.json": lambda b: b"\xfe\xff\x00{"}),
    Bad("profile-missing", EST_PROFILE, r"cannot read profile '{d}/profile\.json': it does not exist; "
        r"re-run `planner profile"),
]
