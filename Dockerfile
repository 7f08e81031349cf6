# syntax=docker/dockerfile:1
# sunkd container image: `docker build -t sunkd:0.1.0 .`
# Stage 1 builds sunkd's wheel and the wheels of its dependencies; stage 2 installs them
# into a clean slim Python and runs as an unprivileged user. Pin the base by digest in your
# registry mirror for reproducible builds (docs/deploy.md, "Container image").
# Health: Kubernetes uses the Deployment's probes (/healthz, /readyz) and ignores
# HEALTHCHECK; Docker and Compose use the HEALTHCHECK below.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sunkd ./sunkd
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SUNKD_LISTEN=0.0.0.0:8080
RUN groupadd --system --gid 10001 sunkd \
    && useradd --system --uid 10001 --gid sunkd --home-dir /var/lib/sunkd --no-create-home \
       --shell /usr/sbin/nologin sunkd \
    && install -d -o sunkd -g sunkd -m 0750 /var/lib/sunkd
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/sunkd-*.whl
WORKDIR /var/lib/sunkd
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["sunkd"]
CMD ["run"]
