#!/bin/bash
# gpud-bench with the persistent worker off (the in-process baseline alone).
ERLCUDA_PERSIST=0 exec "$(dirname "$0")/gpud-bench" "$@"
