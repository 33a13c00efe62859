# ckptguard service image: multi-stage, non-root, no build tools in the final stage.
#   docker build -t ckptguard .            (podman: see the README's Deployment section)
#   docker run -p 8000:8000 -v ckptguard-data:/data ckptguard
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# The dependencies first, in a layer of their own (keyed by pyproject.toml alone), so a change
# to the sources or the README rebuilds in seconds instead of reinstalling them: the project
# without its packages (and an empty README) installs the dependencies only. Wheels only: the
# base needs no compiler.
COPY pyproject.toml ./
RUN touch README.md && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --only-binary=:all: --no-compile 'setuptools>=68' wheel \
 && /opt/venv/bin/pip install --no-build-isolation '.[postgres]' \
 && /opt/venv/bin/pip uninstall -y ckptguard \
 && /opt/venv/bin/python -m compileall -q -j 0 /opt/venv
COPY README.md ./
COPY core ./core
COPY app ./app
# the installed package: the public API and its two links, ckptguard/core and ckptguard/app
COPY ckptguard ./ckptguard
RUN /opt/venv/bin/pip install --no-build-isolation --no-deps . \
 && /opt/venv/bin/pip uninstall -y pip setuptools wheel \
 && /opt/venv/bin/python -m compileall -q -j 0 /opt/venv
# The bytecode stays in the image: the final stage's code is root's and read-only to the
# service, so a process could never cache what it compiles, and every start (the service, each
# scan worker, `ckptguard scan` in the container) would recompile ckptguard and its
# dependencies: ~0.4 s of a one-file scan (tests/e2e/test_container.py checks it is there).

FROM ${BASE}
LABEL org.opencontainers.image.title="ckptguard" \
      org.opencontainers.image.description="Checkpoint scanner service: judges model files without executing them"
COPY --from=build /opt/venv /opt/venv
RUN useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin ckptguard \
 && mkdir -p /data && chown ckptguard /data
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    CKPTGUARD_HOST=0.0.0.0 CKPTGUARD_PORT=8000 CKPTGUARD_DATA_DIR=/data
USER ckptguard
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('CKPTGUARD_PORT', '8000') + '/healthz', timeout=4)"]
CMD ["ckptguard", "serve"]
