#!/usr/bin/env bash
# What online discard costs a move: benchmarks/free_cost.py and
# benchmarks/floor_vs_move.py on the filesystem that holds DIR, as it is
# mounted (with `discard`) and remounted with `nodiscard`, then mounted as it
# was again. Needs root; the mount must have `discard` to begin with (this
# script refuses otherwise, so it never changes a mount it would not restore).
#
#   [PYTHON=python3] bash benchmarks/discard_ab.sh DIR [REPEAT=5] [STATES="uncached cached"] [SETTINGS="discard nodiscard"]
#
# Each setting runs free_cost.py once, then floor_vs_move.py (floor, plain,
# floor-free, move, copy, or $METHODS; 2 x 1 GiB, 128-byte header) once per source state.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$1
repeat=${2:-5}
states=${3:-"uncached cached"}
settings=${4:-"discard nodiscard"}
py=${PYTHON:-python3}
mkdir -p "$dir"
target=$(findmnt -no TARGET -T "$dir")
options=$(findmnt -no OPTIONS -T "$dir")
case ",$options," in
  *,discard,*) ;;
  *) echo "discard_ab.sh: $target is not mounted with discard ($options)" >&2; exit 2 ;;
esac
restore() { mount -o remount,discard "$target"; }
trap restore EXIT
echo "$(uname -r); $(nproc) cores; $target: $(findmnt -no SOURCE,FSTYPE -T "$dir")"
lsblk -D "$(findmnt -no SOURCE -T "$dir")" || true
export PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
for setting in $settings; do
  mount -o "remount,$setting" "$target"
  echo "== $setting: $(findmnt -no OPTIONS "$target")"
  "$py" "$here/free_cost.py" "$dir/free"
  for state in $states; do
    cached=0; [ "$state" = cached ] && cached=1
    echo "-- $setting, $state"
    CACHED=$cached METHODS=${METHODS:-floor,plain,floor-free,move,copy} \
      "$py" "$here/floor_vs_move.py" "$dir/fvm" 1024 2 "$repeat"
  done
done
