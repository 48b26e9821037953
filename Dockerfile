# squant serve in a container: CPU-only torch, non-root, a healthcheck on /ready.
#
#   docker build -t squant .
#   docker run -p 8080:8080 -v $PWD/int8:/models/int8:ro -e SQUANT_API_KEY=... squant
#
# MODEL (the CMD) is a directory from `squant quantize` or `squant export`, mounted read-only.
FROM python:3.11-slim

# A C++ compiler: squant.compile (TorchInductor) and squant's int8 attention kernel build
# their code with it at start-up.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/squant
COPY pyproject.toml README.md ./
COPY squant ./squant
# torch from PyTorch's CPU index: the default index's wheel pulls several GB of CUDA libraries
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && pip install --no-cache-dir ".[serve,st]"

RUN useradd --create-home --uid 10001 squant
USER squant
# built kernels, model packages and compiled code are cached here; mount a volume to keep
# them across restarts (a restart then loads the package instead of building it)
ENV SQUANT_CACHE=/home/squant/.cache/squant \
    TORCHINDUCTOR_CACHE_DIR=/home/squant/.cache/inductor
EXPOSE 8080
# /ready is 200 once every shape is warm (503 before): minutes for a quantized directory that
# compiles at start-up, seconds for an export directory
HEALTHCHECK --interval=15s --timeout=3s --start-period=600s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/ready', timeout=2).status != 200)"
ENTRYPOINT ["squant", "serve", "--host", "0.0.0.0", "--port", "8080"]
CMD ["/models/int8"]
