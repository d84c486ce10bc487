# toolsentry proxy alone (no evalkit, no numpy or matplotlib): slim Python, dependencies from a
# hashed lock, non-root, health-checked on /healthz (alive; /readyz also waits for the upstreams,
# which may take minutes to load a model). tests/test_docker.py checks this file and
# tests/test_install.py runs its install steps in a clean virtual environment.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    TOOLSENTRY_HOST=0.0.0.0 TOOLSENTRY_PORT=8000

WORKDIR /app
# Every dependency and build tool pinned with its hashes (scripts/docker-lock writes the lock);
# the project itself is then built from them alone, nothing resolved or fetched unpinned.
COPY requirements/docker.lock ./requirements/
RUN pip install --no-cache-dir --require-hashes -r requirements/docker.lock
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install --no-cache-dir --no-deps --no-build-isolation '.[redis]' \
    && useradd --create-home --uid 10001 toolsentry \
    && mkdir -p /var/lib/toolsentry && chown toolsentry /var/lib/toolsentry

USER toolsentry
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TOOLSENTRY_PORT', '8000'), timeout=2)"]

ENTRYPOINT ["toolsentry", "serve"]
