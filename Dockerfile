# syntax=docker/dockerfile:1
# CPU image by default. For CUDA: --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 --build-arg VARIANT=cuda
ARG BASE=python:3.11-slim
ARG VARIANT=cpu

FROM ${BASE} AS build
ARG VARIANT
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rectrain rectrain
COPY recserve recserve
COPY protos protos
RUN pip install --no-cache-dir . && \
    if [ "$VARIANT" = "cuda" ]; then \
      pip uninstall -y fbgemm-gpu-cpu torch && \
      pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cu128 torch==2.13.0 fbgemm-gpu==1.8.0; \
    fi

FROM ${BASE}
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN useradd --create-home --uid 10001 rec
USER rec
WORKDIR /home/rec
ENTRYPOINT ["rectrain"]
CMD ["--help"]
