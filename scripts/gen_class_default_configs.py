"""Write library configs for architectures whose real config.json kvplan could not find verbatim.

Transformers documents some config classes' defaults as the shape of a real checkpoint (Gemma3nConfig: "defaults
will yield a similar configuration to that of google/gemma-3n-E4B"). Such a file is Transformers' own
serialisation of those defaults, not the checkpoint's config.json; model_configs/SOURCES.md says so.
Run with transformers installed:  python scripts/gen_class_default_configs.py
"""

from __future__ import annotations

import json
import pathlib

import transformers

# file stem -> config class name in transformers
CLASSES = {"transformers__gemma-3n-class-defaults": "Gemma3nConfig"}


def main() -> None:
    out_dir = pathlib.Path(__file__).resolve().parent.parent / "model_configs"
    for stem, class_name in CLASSES.items():
        cfg = getattr(transformers, class_name)().to_dict()
        cfg["transformers_version"] = transformers.__version__
        (out_dir / f"{stem}.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        print(f"wrote {stem}.json from transformers {transformers.__version__} {class_name}()")


if __name__ == "__main__":
    main()
