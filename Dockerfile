# kvlab as a Hugging Face Docker Space (or any container host): the app on port
# 7860, with the bundled model converted and cached at build time.
FROM python:3.11-slim

# A CPU-only torch wheel index keeps the image small; build with
# --build-arg KVLAB_TORCH_INDEX_URL= to take torch from PyPI instead.
ARG KVLAB_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# g++ builds optimum-quanto's CPU kernel once at image build (scripts/setup.sh
# runs `python -m kvlab.caches.backends`, which runs the ninja that pip puts in
# .venv/bin), so no compiler runs while the app serves. g++ and cmake also build
# llama-cpp-python (source only on PyPI) in the dependency layer (12-20 minutes
# on 2 cores; scripts/setup.sh gives its CMAKE_ARGS).
RUN apt-get update \
    && apt-get install -y --no-install-recommends make g++ cmake \
    && rm -rf /var/lib/apt/lists/*

# Hugging Face Spaces run the container as uid 1000. The app folder is made
# here because some builders create a WORKDIR owned by root.
RUN useradd -m -u 1000 user \
    && install -d -o user -g user /home/user/app
USER user
ENV HOME=/home/user \
    PYTHONUNBUFFERED=1 \
    KVLAB_CACHE_DIR=/home/user/.cache/kvlab \
    KVLAB_PUBLIC=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860
WORKDIR /home/user/app

# Dependencies first, so that code changes reuse this layer; kvlab itself
# (editable, no dependencies) once the source is there.
COPY --chown=user requirements.txt requirements-test.txt requirements.lock pyproject.toml ./
COPY --chown=user scripts/setup.sh scripts/
RUN KVLAB_TORCH_INDEX_URL="$KVLAB_TORCH_INDEX_URL" PIP_NO_CACHE_DIR=1 bash scripts/setup.sh --no-project

COPY --chown=user . .
RUN PIP_NO_CACHE_DIR=1 bash scripts/setup.sh \
    && .venv/bin/python -c "from kvlab.models import prepare_bundled_model; prepare_bundled_model()" \
    && .venv/bin/python -c "from kvlab.models.whisper import prepare_speech; prepare_speech()"

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["/home/user/app/.venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/', timeout=5)"]
CMD [".venv/bin/python", "app.py"]
