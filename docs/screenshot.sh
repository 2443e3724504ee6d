#!/bin/sh
# Re-take docs/luigi-ui.png (the task list) and docs/luigi-ui-progress.png (the workers tab: the running
# task's progress bar): a short sample run on a throw-away luigid, shot headless with Chromium
# (apt-get install -y chromium) while Train runs. Usage: sh docs/screenshot.sh  (from the repository root)
set -e
port=8093
work=$(mktemp -d)
mkdir -p "$work/luigid"
.venv/bin/luigid --address 127.0.0.1 --port $port --state-path "$work/luigid/state.pickle" --logdir "$work/luigid" &
luigid=$!
trap 'kill $luigid 2>/dev/null; rm -rf "$work"' EXIT
cat > "$work/ui.yaml" <<YAML
extends: $(pwd)/configs/sample.yaml
paths:
  work_dir: $work/out
training:
  epochs: 3
YAML
sleep 3
.venv/bin/deepspeech-train Export --config "$work/ui.yaml" --scheduler-port $port > "$work/run.log" 2>&1 &
run=$!
# wait until Train has reported progress, then shoot the task list
until grep -q "epoch 1/3, step" "$work/run.log" 2>/dev/null; do sleep 2; done
sleep 20
chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1500,820 \
  --virtual-time-budget=8000 --screenshot=docs/luigi-ui.png "http://127.0.0.1:$port/static/visualiser/index.html"
chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1500,520 \
  --virtual-time-budget=8000 --screenshot=docs/luigi-ui-progress.png \
  "http://127.0.0.1:$port/static/visualiser/index.html#tab=workers"
kill $run 2>/dev/null || true
