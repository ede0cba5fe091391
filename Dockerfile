# fqbroker in a container (docs/deploy.md):
#   docker build -t fqbroker .
#   docker run -d --name fqbroker -p 127.0.0.1:8765:8765 -v fqbroker-data:/var/lib/fqbroker fqbroker
# Arguments after the image name are fqd flags, e.g. `--lumberjack 0.0.0.0:5044`.

# Both stages on one image: the venv's python is a link into the base image's.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY . /src
# A virtual environment of its own, copied whole into the final image: no compiler, no
# build backend and no source tree there.
RUN python -m venv /opt/fqbroker \
    && /opt/fqbroker/bin/pip install '/src[uvloop]'

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/fqbroker/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/fqbroker /opt/fqbroker
COPY conf/docker/fqd.toml /etc/fqbroker/fqd.toml
# A user of its own (not root) that owns only the data directory.
RUN groupadd --system --gid 10001 fqbroker \
    && useradd --system --uid 10001 --gid fqbroker --home-dir /var/lib/fqbroker \
       --shell /usr/sbin/nologin fqbroker \
    && install -d -o fqbroker -g fqbroker -m 0750 /var/lib/fqbroker
USER fqbroker:fqbroker
WORKDIR /var/lib/fqbroker
VOLUME ["/var/lib/fqbroker"]
# The one port for fq clients, peers, HTTP, /metrics and the web UI.
EXPOSE 8765
# /stats.json answers once the broker listens. With http_auth_reads = true it needs a
# token: override the check (docker run --health-cmd) to send one.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/stats.json', timeout=4)"]
# SIGTERM (docker stop) makes fqd flush its disk queues and exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["fqd", "--config", "/etc/fqbroker/fqd.toml"]
CMD []
