#!/bin/sh
# Build guest.wasm from app.py against the WIT in ./wit, then embed
# guest.toml as the component's manifest (for `wasmstate guest install`).
set -eu
cd "$(dirname "$0")"
# Two interfaces are called `types` (ours and wasi:http's): name them apart.
componentize-py -d wit -w guest \
  --import-interface-name 'wasmstate:backend/types@0.3.0=backend_types' \
  --import-interface-name 'wasi:http/types@0.2.12=types' \
  componentize app -o guest.wasm
wasmstate guest embed-manifest guest.wasm guest.toml
