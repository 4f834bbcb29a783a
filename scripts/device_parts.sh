# What the device calls share (scripts/device_check.sh, scripts/device_ros.sh): sourced, not run. They set PY (the
# interpreter) first; sourcing makes RAW (the raw results folder) and the unpacked wheels' folder in one scratch
# folder that is removed when the calling script exits (all of it is in the tarballs by then); run_part sets
# status=1 when a part does not pass.
#
#   . scripts/device_parts.sh
#   device_wheels gpu_wheels                              # pure-Python wheels onto PYTHONPATH, never installed
#   run_part tokens 45 "$OUT_DIR/check.tar.gz" "$PY" -m wam_diff2_core.cli verify-device --parts tokens ...

SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
RAW=$SCRATCH/raw
mkdir -p "$RAW"

device_wheels() {       # the wheels in $1 unpacked onto PYTHONPATH (the checkout first), offline Hugging Face
    local extra="" wheel
    if compgen -G "$1/*.whl" > /dev/null; then
        extra=$SCRATCH/wheels
        for wheel in "$1"/*.whl; do
            "$PY" -m zipfile -e "$wheel" "$extra" || { echo "cannot unpack $wheel" >&2; exit 2; }
        done
        echo "wheels from $1 on PYTHONPATH ($(ls "$1" | tr '\n' ' '))"
    fi
    export PYTHONPATH="$PWD${extra:+:$extra}${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
}

run_part() {            # NAME BOUND TARBALL COMMAND...: COMMAND under `timeout BOUND` (5 s more to die), its output
                        # in $RAW/NAME.log, its result in $RAW/status.txt, then $RAW packed into TARBALL
    local name=$1 bound=$2 tarball=$3 start=$SECONDS rc result
    shift 3
    echo "== $name (at most $bound s)"
    timeout -k 5 "$bound" "$@" > "$RAW/$name.log" 2>&1
    rc=$?
    case $rc in
        0) result=passed ;;
        124|137) result="STOPPED at its bound" ;;
        *) result="FAILED (exit $rc)" ;;
    esac
    [ $rc -eq 0 ] || status=1
    echo "$name: $result after $((SECONDS - start)) s" | tee -a "$RAW/status.txt"
    tail -n 4 "$RAW/$name.log"
    tar czf "$tarball" -C "$RAW" .
    return $rc
}
