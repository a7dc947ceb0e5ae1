"""Generate kvplan/check/engine_flags.json: vLLM's and SGLang's command-line flags, read from their own source.

    pip download --no-deps vllm==0.33.0 sglang==0.5.23 -d /tmp/engines
    (cd /tmp/engines && for w in *.whl; do unzip -q -o "$w" 'vllm/*' 'sglang/*' -d "${w%%-*}"; done)
    python scripts/gen_flag_tables.py --vllm /tmp/engines/vllm --sglang /tmp/engines/sglang

Each --vllm / --sglang names a directory holding the package's source (an unpacked wheel or a checkout's
python/ folder), optionally as DIR@VERSION; without @VERSION the version comes from the package's
_version.py or version.py. Several may be given: the table is the union over those versions, and each flag
records the versions that have it, so manifests written for an older engine still parse. The source is read
with `ast` and never imported or run. The fetched source is not part of this repository.

What is read:
- `parser.add_argument("--name", "-alias", action=..., nargs=..., **kwargs)` calls anywhere in the files read:
  the flag names, and whether the flag takes a value (store_true / BooleanOptionalAction: none; nargs '+':
  every following word; nargs '?': an optional value);
- vLLM's `**group_kwargs["field"]` (from `get_kwargs(SomeConfig)`): the kind comes from that dataclass field's
  annotation, as vLLM's get_kwargs derives it (bool -> --name/--no-name, list/tuple/set -> nargs '+');
- vLLM's frontend dataclasses (`*FrontendArgs`), whose every field is a `--field-name` flag;
- SGLang's annotated fields `name: A[type, "help" | Arg(...)]` that add_cli_args_from_dataclass registers
  (`cli_name`, `aliases`, `action`, `nargs`, `no_cli` as in Arg; bool -> store_true, list -> nargs '+').
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "kvplan" / "check" / "engine_flags.json"
VLLM_FILES = ("engine/arg_utils.py", "entrypoints/openai/cli_args.py", "entrypoints/common/cli_args.py",
              "entrypoints/cli/serve.py")
SGLANG_FILES = ("srt/server_args.py",)
SGLANG_FIELD_DIRS = ("srt/arg_groups/fields", "srt/arg_groups")
_BOOLEAN_ACTIONS = {"store_true", "store_false", "StoreBoolean", "BooleanOptionalAction",
                    "DeprecatedStoreTrueAction", "StoreTrueAction"}
_VERSION_RE = re.compile(r"""__version__\s*(?::\s*str)?\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""")


def _source(root: Path, rel: str) -> ast.Module | None:
    path = root / rel
    return ast.parse(path.read_text(), str(path)) if path.is_file() else None


def version_of(root: Path, package: str) -> str:
    """The version an unpacked wheel or checkout states, e.g. '0.33.0'."""
    for name in ("_version.py", "version.py"):
        path = root / package / name
        if path.is_file():
            match = _VERSION_RE.search(path.read_text())
            if match:
                return match.group(1)
    raise SystemExit(f"{root}: no {package}/_version.py with __version__; give the version as DIR@VERSION")


def kind_of_annotation(annotation: ast.expr | None) -> tuple[str, bool]:
    """(kind, negatable) from a field's annotation, as vLLM's get_kwargs / SGLang's Arg derive it."""
    text = ast.unparse(annotation) if annotation is not None else ""
    words = set(re.findall(r"[A-Za-z_]+", text))
    if "bool" in words and "str" in words:
        return "optional", False  # `--hf-token` alone, or `--hf-token TOKEN`
    if "bool" in words:
        return "boolean", True
    if words & {"list", "List", "tuple", "Tuple", "set", "Set"} and not words & {"dict", "Dict"}:
        return "multi", False
    return "value", False


def _annotations(tree: ast.Module) -> dict[str, dict[str, ast.expr]]:
    """Every class's annotated fields: {class name: {field: annotation}}."""
    found: dict[str, dict[str, ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            fields = found.setdefault(node.name, {})
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fields[item.target.id] = item.annotation
    return found


def _const(node: ast.expr) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _action(call: ast.Call) -> tuple[str, bool] | None:
    """The kind an add_argument call's explicit keywords give, or None when they say nothing."""
    for keyword in call.keywords:
        if keyword.arg == "action":
            name = ast.unparse(keyword.value).rsplit(".", 1)[-1].strip("'\"")
            if name in _BOOLEAN_ACTIONS:
                return "boolean", name == "BooleanOptionalAction"
        if keyword.arg == "nargs":
            nargs = _const(keyword.value)
            if nargs in ("+", "*"):
                return "multi", False
            if nargs == "?":
                return "optional", False
    if any(k.arg in ("type", "choices", "default") for k in call.keywords):
        return "value", False
    return None


def _kwargs_sources(tree: ast.Module) -> dict[str, str]:
    """`model_kwargs = get_kwargs(ModelConfig)` -> {"model_kwargs": "ModelConfig"}."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func).endswith("get_kwargs") and node.value.args):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = ast.unparse(node.value.args[0]).rsplit(".", 1)[-1]
    return found


def add_argument_flags(tree: ast.Module, classes: dict[str, dict[str, ast.expr]]) -> dict[str, dict]:
    """Every add_argument call with literal flag names: {canonical: {kind, negatable, aliases}}."""
    sources = _kwargs_sources(tree)
    flags: dict[str, dict] = {}
    for node in ast.walk(tree):
        is_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if not (is_call and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        names = [n for n in names if n.startswith("-")]
        if not names:
            continue
        kind = _action(node)
        for keyword in node.keywords:
            # **model_kwargs["max_model_len"] (also inside **{**..., "default": None}): the field's annotation
            # decides, as get_kwargs does.
            spread = [keyword.value] if keyword.arg is None else []
            if spread and isinstance(spread[0], ast.Dict):
                spread = [v for k, v in zip(spread[0].keys, spread[0].values, strict=True) if k is None]
            for value in spread:
                if not isinstance(value, ast.Subscript):
                    continue
                owner = sources.get(ast.unparse(value.value))
                field = str(_const(value.slice))
                annotation = classes.get(owner or "", {}).get(field) or classes.get("EngineArgs", {}).get(field)
                if annotation is not None and kind in (None, ("value", False)):
                    kind = kind_of_annotation(annotation)
        record(flags, names, kind or ("value", False))
    return flags


def frontend_flags(classes: dict[str, dict[str, ast.expr]]) -> dict[str, dict]:
    """vLLM's frontend dataclasses: each field is `--field-name` (vllm serve's host, port, api-key, ...)."""
    flags: dict[str, dict] = {}
    for name, fields in classes.items():
        if name.endswith("FrontendArgs"):
            for field, annotation in fields.items():
                if not field.startswith("_"):
                    record(flags, ["--" + field.replace("_", "-")], kind_of_annotation(annotation))
    return flags


def sglang_field_flags(tree: ast.Module) -> dict[str, dict]:
    """SGLang's `name: A[type, "help" | Arg(...)]` fields, as add_cli_args_from_dataclass registers them."""
    flags: dict[str, dict] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = node.annotation
        if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("A", "Annotated")):
            continue
        parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        meta = [p for p in parts[1:] if isinstance(p, ast.Constant) and isinstance(p.value, str)
                or isinstance(p, ast.Call) and ast.unparse(p.func) == "Arg"]
        if not meta:
            continue  # not registered automatically
        arg = next((m for m in meta if isinstance(m, ast.Call)), None)
        options = {k.arg: k.value for k in arg.keywords} if arg is not None else {}
        if _const(options["no_cli"]) if "no_cli" in options else False:
            continue
        cli_name = _const(options["cli_name"]) if "cli_name" in options else None
        names = [str(cli_name) if cli_name else "--" + node.target.id.replace("_", "-")]
        if "aliases" in options and isinstance(options["aliases"], ast.List):
            names += [str(_const(a)) for a in options["aliases"].elts if isinstance(_const(a), str)]
        if "action" in options:
            name = ast.unparse(options["action"]).rsplit(".", 1)[-1].strip("'\"")
            kind = ("boolean", False) if name in _BOOLEAN_ACTIONS else ("value", False)
        elif "nargs" in options:
            nargs = _const(options["nargs"])
            kind = ("multi" if nargs in ("+", "*") else "optional" if nargs == "?" else "value", False)
        elif "type_parser" in options:
            kind = ("value", False)
        else:
            kind = kind_of_annotation(parts[0])
            kind = (kind[0], False)  # SGLang registers bools as store_true: no --no-NAME
        record(flags, names, kind)
    return flags


def record(flags: dict[str, dict], names: list[str], kind: tuple[str, bool]) -> None:
    """Add one flag under its canonical name: the longest long form (`--tensor-parallel-size`, not `--tp`)."""
    long_names = [n for n in names if n.startswith("--")] or names
    canonical = max(long_names, key=len).lstrip("-")
    entry = flags.setdefault(canonical, {"kind": kind[0], "negatable": kind[1], "aliases": []})
    if kind[0] == "boolean":
        entry["kind"], entry["negatable"] = "boolean", entry["negatable"] or kind[1]
    for name in names:
        alias = name.lstrip("-")
        if alias != canonical and alias not in entry["aliases"]:
            entry["aliases"].append(alias)


def read_vllm(root: Path) -> dict[str, dict]:
    trees = [t for t in (_source(root / "vllm", rel) for rel in VLLM_FILES) if t is not None]
    if not trees:
        raise SystemExit(f"{root}: no vllm/engine/arg_utils.py")
    classes: dict[str, dict[str, ast.expr]] = {}
    for path in sorted((root / "vllm" / "config").glob("*.py")) + [root / "vllm" / "config.py"]:
        if path.is_file():
            classes.update(_annotations(ast.parse(path.read_text(), str(path))))
    for tree in trees:
        classes.update(_annotations(tree))
    flags: dict[str, dict] = {}
    for tree in trees:
        merge(flags, add_argument_flags(tree, classes))
    merge(flags, frontend_flags(classes))
    return flags


def read_sglang(root: Path) -> dict[str, dict]:
    flags: dict[str, dict] = {}
    for rel in SGLANG_FILES:
        tree = _source(root / "sglang", rel)
        if tree is not None:
            merge(flags, add_argument_flags(tree, {}))
            merge(flags, sglang_field_flags(tree))
    for folder in SGLANG_FIELD_DIRS:
        for path in sorted((root / "sglang" / folder).glob("*.py")):
            merge(flags, sglang_field_flags(ast.parse(path.read_text(), str(path))))
    if not flags:
        raise SystemExit(f"{root}: no sglang/srt/server_args.py flags")
    return flags


def merge(into: dict[str, dict], new: dict[str, dict]) -> None:
    for name, entry in new.items():
        kind = (entry["kind"], entry["negatable"])
        record(into, [f"--{name}"] + [f"--{a}" if len(a) > 1 else f"-{a}" for a in entry["aliases"]], kind)


def table(sources: list[str], package: str, read) -> dict:
    """The union over versions: each flag with its kind, aliases and the versions that have it."""
    flags: dict[str, dict] = {}
    versions = []
    for source in sources:
        path, _, version = source.partition("@")
        root = Path(path)
        version = version or version_of(root, package)
        versions.append(version)
        for name, entry in read(root).items():
            merge(flags, {name: entry})
            flags[name].setdefault("versions", [])
            if version not in flags[name]["versions"]:
                flags[name]["versions"].append(version)
    # An alias that is also a canonical name elsewhere (an old flag renamed) stays a flag of its own.
    for entry in flags.values():
        entry["aliases"] = sorted(a for a in entry["aliases"] if a not in flags)
    return {"versions": versions, "flags": dict(sorted(flags.items()))}


def render(data: dict) -> str:
    """JSON with one line per flag, so a regeneration reads as a diff of flags."""
    lines = ["{", f' "generated_by": {json.dumps(data["generated_by"])},', ' "engines": {']
    engines = list(data["engines"].items())
    for i, (engine, entry) in enumerate(engines):
        lines.append(f'  "{engine}": {{"versions": {json.dumps(entry["versions"])}, "flags": {{')
        flags = list(entry["flags"].items())
        for j, (name, flag) in enumerate(flags):
            lines.append(f"   {json.dumps(name)}: {json.dumps(flag)}" + ("," if j < len(flags) - 1 else ""))
        lines.append("  }}" + ("," if i < len(engines) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--vllm", action="append", default=[], help="DIR[@VERSION] holding vllm/ source")
    parser.add_argument("--sglang", action="append", default=[], help="DIR[@VERSION] holding sglang/ source")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if not args.vllm or not args.sglang:
        parser.error("give at least one --vllm and one --sglang source directory")
    data = {
        "generated_by": "scripts/gen_flag_tables.py (from the engines' own argument definitions, read with ast)",
        "engines": {"vllm": table(args.vllm, "vllm", read_vllm), "sglang": table(args.sglang, "sglang", read_sglang)},
    }
    Path(args.out).write_text(render(data))
    for engine, entry in data["engines"].items():
        print(f"{engine} {', '.join(entry['versions'])}: {len(entry['flags'])} flags", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
