# syntax=docker/dockerfile:1
# One image for the operator and for the workspace pods (shared/DESIGN.md: "One image serves as
# the operator and as the workspace pod"). Two entrypoints:
#   operator (default CMD):  kopf run --standalone --all-namespaces -m sandbox_operator.main ...
#   workspace pod:           sandbox-core serve-workspace   (set as the pod's args)
# Both run under tini as PID 1, so signals reach the process and git's children are reaped.
#
# The base image is pinned by digest (a tag moves; a digest names one build). To move it, resolve
# the tag's current index digest (`docker buildx imagetools inspect python:3.11-slim`) and replace
# both FROM lines. The version label comes from pyproject.toml, the one place the version is
# written: docker build --build-arg VERSION="$(hack/version.sh)" .

# --- build: install the project and its operator extras into a virtualenv -------------------
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7 AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY sandbox_core ./sandbox_core
COPY sandbox_api ./sandbox_api
COPY operator ./operator
RUN /opt/venv/bin/pip install ".[operator]"

# --- runtime ---------------------------------------------------------------------------------
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

ARG VERSION

LABEL org.opencontainers.image.title="sandbox-operator" \
      org.opencontainers.image.description="Kubernetes operator and workspace image for plan sandboxes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/cleveragents/sandbox-operator"

# git: git_worktree sandboxes; rsync: copy_on_write/overlay commits; tini: PID 1;
# bubblewrap: the jail of an actor's commands (docs/actor.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git rsync tini ca-certificates bubblewrap \
    && rm -rf /var/lib/apt/lists/*

# Source volumes are usually owned by another UID than ours: without safe.directory git refuses
# them ("dubious ownership"). The identity is a fallback; the core passes its own with -c.
RUN git config --system --add safe.directory '*' \
    && git config --system user.name "sandbox-operator" \
    && git config --system user.email "sandbox-operator@sandbox.cleveragents.io"

# A fixed non-root UID/GID (65532, the distroless "nonroot" convention) that the chart's
# securityContext (runAsUser/runAsGroup 65532) matches.
RUN groupadd --gid 65532 sandbox \
    && useradd --uid 65532 --gid 65532 --home-dir /home/sandbox --create-home \
       --shell /usr/sbin/nologin sandbox \
    && mkdir -p /var/lib/sandbox-operator/state /var/lib/sandbox-operator/sandboxes /workspace \
    && chown -R 65532:65532 /var/lib/sandbox-operator /workspace

COPY --from=build /opt/venv /opt/venv

ENV PATH="/opt/venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/sandbox

USER 65532:65532
WORKDIR /workspace

# 8080: kopf liveness (/healthz); 9090: Prometheus metrics (/metrics).
EXPOSE 8080 9090

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["kopf", "run", "--standalone", "--all-namespaces", "-m", "sandbox_operator.main", \
     "--liveness=http://0.0.0.0:8080/healthz"]
