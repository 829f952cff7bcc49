# tuneloop: one image for the API, the workers and the simulator target server.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY api ./api
COPY executor ./executor
COPY prompts ./prompts
COPY simulator ./simulator
COPY state ./state
COPY examples ./examples
COPY tuneloop_cli.py ./
RUN pip install . && useradd --create-home --uid 10001 tuneloop && mkdir -p /data && chown tuneloop /data
USER tuneloop
WORKDIR /data
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=5 CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/health').status != 200)"
CMD ["tuneloop", "serve", "--host", "0.0.0.0", "--port", "8080"]
