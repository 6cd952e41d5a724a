# Sourced by the GPU scripts: point ATTNFORGE_NVRTC at the GPU machine's NVRTC
# 13 (torch's environment first) unless it is set already.
if [ -z "${ATTNFORGE_NVRTC:-}" ]; then
  for c in /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13 \
           /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib/libnvrtc.so.13 \
           /usr/local/cuda/lib64/libnvrtc.so.13; do
    [ -e "$c" ] && export ATTNFORGE_NVRTC="$c" && break
  done
fi
