# syntax=docker/dockerfile:1
# rectrain / recserve images, built from one Dockerfile (no network needed at run time):
#   docker build --target rectrain -t rectrain:0.1.0 .   training: ENTRYPOINT rectrain (k8s runs torchrun in it)
#   docker build -t recserve:0.1.0 .                     serving (the default, last stage): ENTRYPOINT recserve,
#                                                        gRPC HEALTHCHECK, ports 50051 (gRPC) and 9400 (metrics)
# CPU by default. CUDA (torch cu wheel + fbgemm-gpu; CUDA bases ship without Python, the base stage adds it):
#   docker build --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 --build-arg VARIANT=cu128 ...
ARG BASE=python:3.11-slim

FROM ${BASE} AS base
RUN if ! command -v python3 >/dev/null 2>&1; then \
      apt-get update && \
      apt-get install -y --no-install-recommends python3 python3-venv ca-certificates && \
      rm -rf /var/lib/apt/lists/*; \
    fi
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

FROM base AS build
# VARIANT names the PyTorch wheel index: cpu, or a CUDA tag such as cu128.
ARG VARIANT=cpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/${VARIANT}
RUN python3 -m venv /opt/venv && pip install --no-cache-dir --upgrade pip
# torch first, from the variant's index, so that `pip install .` finds torch==2.13.0 already satisfied instead
# of pulling the default (CUDA) wheel from PyPI. torch and FBGEMM are pinned in lock-step (see pyproject.toml).
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" torch==2.13.0
WORKDIR /src
# .dockerignore admits only what the install needs; setup.py's build hook generates the gRPC stubs from protos/.
COPY . .
RUN pip install --no-cache-dir . && \
    if [ "${VARIANT}" != "cpu" ]; then \
      pip uninstall -y fbgemm-gpu-cpu && \
      pip install --no-cache-dir --index-url "${TORCH_INDEX}" fbgemm-gpu==1.8.0; \
    fi && \
    rectrain --help >/dev/null && recserve --help >/dev/null && \
    python -c "import fbgemm_gpu, recserve.v1.predictor_pb2_grpc"

FROM base AS runtime
RUN groupadd --gid 10001 rec && \
    useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin rec
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/recserve/healthcheck.py
USER 10001:10001
WORKDIR /home/rec

FROM runtime AS rectrain
ENTRYPOINT ["rectrain"]
CMD ["--help"]

FROM runtime AS recserve
ENV RECSERVE_PORT=50051
EXPOSE 50051 9400
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "/opt/recserve/healthcheck.py"]
ENTRYPOINT ["recserve"]
# A package mounted at /package: docker run -p 127.0.0.1:50051:50051 -v "$PWD/out/package:/package:ro" recserve:0.1.0
CMD ["serve", "--package", "/package", "--host", "0.0.0.0", "--port", "50051", \
     "--metrics-host", "0.0.0.0", "--metrics-port", "9400"]
