#!/usr/bin/env bash
# Does a loop filesystem's speed depend on whether its image file was ever
# written? benchmarks/floor_vs_move.py on two loop filesystems of one type,
# made alike in DIR except for the image: `sparse` (truncate -s, as the tests,
# write_floor.py and trtet-store bench make theirs: each block the filesystem
# writes for the first time is also allocated in the host's filesystem) and
# `filled` (every byte written once before mkfs: each write is an overwrite
# of allocated host blocks). Both attached as `mount -o loop` attaches them
# (buffered, through the host's page cache). The two alternate, ROUNDS times
# each, per source state. Needs root; everything made is unmounted, detached
# and removed on exit.
#
#   [PYTHON=python3] [FSTYPE=ext4] [IMAGE_GIB=8] [ROUNDS=2] [METHODS=floor,plain,move,copy] \
#     bash benchmarks/image_ab.sh DIR [REPEAT=5] [STATES="uncached cached"] [SIZE_MIB=1024]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$1
repeat=${2:-5}
states=${3:-"uncached cached"}
size=${4:-1024}
py=${PYTHON:-python3}
fstype=${FSTYPE:-ext4}
gib=${IMAGE_GIB:-8}
rounds=${ROUNDS:-2}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cleanup() {
  for kind in sparse filled; do
    if mountpoint -q "$dir/$kind"; then umount "$dir/$kind"; fi
    rm -rf "${dir:?}/$kind" "$dir/$kind.img"
  done
}
trap cleanup EXIT
echo "$(uname -r); $(nproc) cores; host: $(findmnt -no SOURCE,FSTYPE,OPTIONS -T "$dir")"
for kind in sparse filled; do
  img=$dir/$kind.img
  rm -f "$img"
  t=$(date +%s%N)
  if [ "$kind" = filled ]; then
    dd if=/dev/zero of="$img" bs=8M count=$((gib * 128)) oflag=direct status=none
  else
    truncate -s "${gib}G" "$img"
  fi
  case $fstype in
    ext4) mkfs.ext4 -q -m 0 -F -b 4096 -E nodiscard "$img" ;;
    xfs) mkfs.xfs -q -f -K -m reflink=1 "$img" ;;
    *) echo "image_ab.sh: FSTYPE is ext4 or xfs" >&2; exit 2 ;;
  esac
  mkdir -p "$dir/$kind"
  mount -o loop "$img" "$dir/$kind"
  echo "$kind: $(du -h --apparent-size "$img" | cut -f1) image, $(du -h "$img" | cut -f1) allocated," \
       "made in $(( ($(date +%s%N) - t) / 1000000 )) ms"
done
sync
export PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
for state in $states; do
  cached=0; [ "$state" = cached ] && cached=1
  for round in $(seq "$rounds"); do
    order="sparse filled"; [ $((round % 2)) = 0 ] && order="filled sparse"
    for kind in $order; do
      echo "-- $fstype $state, round $round, $kind image"
      CACHED=$cached METHODS=${METHODS:-floor,plain,move,copy} \
        "$py" "$here/floor_vs_move.py" "$dir/$kind/fvm" "$size" 2 "$repeat" 2>/dev/null
    done
  done
done
