# One image per service, all from one build: `--target gateway|session|runner|sandbox`.
#
#   docker build --target gateway -t bae-gateway .
#   docker build --build-arg BASE_IMAGE=bae-base:bookworm --target session -t bae-session .
#
# BASE_IMAGE is any Debian-like image with python3 (3.11) and its venv module.
# Wheels placed in deploy/wheels/ are preferred to the package index; with
# --build-arg PIP_NO_INDEX=1 the build uses them alone (no network).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG PIP_NO_INDEX=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_FIND_LINKS=/wheels
WORKDIR /src
COPY deploy/wheels/ /wheels/
COPY requirements.txt constraints.txt pyproject.toml setup.py ./
# Runtime dependencies go to /opt/bae.
# The generator (protoc and the mypy-protobuf plugins) and the lint and test tools stay in this stage.
ARG DEV_ONLY='grpcio-tools|mypy-protobuf|mypy|ruff|import-linter|openapi-spec-validator|pipx|py-spy|pytest|pytest-asyncio|playwright|kubernetes-validate|standardwebhooks'
RUN grep -vE "^(${DEV_ONLY})==" requirements.txt > runtime-requirements.txt \
 && python3 -m venv /opt/bae \
 && /opt/bae/bin/pip install --quiet -r runtime-requirements.txt -c constraints.txt \
 && python3 -m venv /opt/gen \
 && /opt/gen/bin/pip install --quiet -c constraints.txt $(grep -E '^(grpcio-tools|protobuf|mypy-protobuf)==' requirements.txt)
COPY protos/ protos/
COPY tools/ tools/
COPY bae/ bae/
# The client library is a distribution of its own that bae depends on.
COPY clients/python/ clients/python/
RUN /opt/gen/bin/python tools/genproto.py \
 && /opt/bae/bin/pip install --quiet --no-deps ./clients/python . \
 && /opt/bae/bin/python -m compileall -q /opt/bae/lib

FROM ${BASE_IMAGE} AS runtime
# Lets `make compose-test` prune this project's superseded (dangling) images.
LABEL bae.image=1
# A fixed uid, so files written into shared volumes (the admin key) are readable by every service.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/bae --shell /usr/sbin/nologin bae \
 && mkdir -p /var/lib/bae /var/lib/bae-admin /etc/bae \
 && chown bae:bae /var/lib/bae /var/lib/bae-admin
COPY --from=build /opt/bae /opt/bae
COPY deploy/healthcheck.py /opt/bae/healthcheck.py
ENV PATH=/opt/bae/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /var/lib/bae
USER bae

FROM runtime AS gateway
ENV BAE_ADDR=0.0.0.0:8080
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=5 \
    CMD ["python", "/opt/bae/healthcheck.py", "gateway"]
CMD ["bae", "gateway"]

FROM runtime AS session
ENV BAE_SESSION_GRPC_ADDR=0.0.0.0:50051
EXPOSE 50051
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=5 \
    CMD ["python", "/opt/bae/healthcheck.py", "session"]
CMD ["bae", "session", "serve"]

FROM runtime AS runner
ENV BAE_RUNNER_GRPC_ADDR=0.0.0.0:50052
EXPOSE 50052
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=5 \
    CMD ["python", "/opt/bae/healthcheck.py", "runner"]
CMD ["bae", "runner"]

# Needs the Docker socket of its host (see README, "Deploy with docker-compose").
FROM runtime AS sandbox
ENV BAE_SANDBOX_LISTEN_ADDR=0.0.0.0:50053
EXPOSE 50053
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=5 \
    CMD ["python", "/opt/bae/healthcheck.py", "sandbox"]
CMD ["bae", "sandbox"]
