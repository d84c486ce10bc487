# toolsentry proxy alone (no evalkit, no numpy or matplotlib): slim Python, non-root, health-checked
# on /readyz. tests/test_install.py runs its install step in a clean virtual environment.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    TOOLSENTRY_HOST=0.0.0.0 TOOLSENTRY_PORT=8000

WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install --no-cache-dir '.[redis]' \
    && useradd --create-home --uid 10001 toolsentry \
    && mkdir -p /var/lib/toolsentry && chown toolsentry /var/lib/toolsentry

USER toolsentry
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status == 200 else 1)"

ENTRYPOINT ["toolsentry", "serve"]
