# JupyterLab and the Ray nodes: the repository's pinned requirements with CPU-only PyTorch.
# The repository itself is mounted at /workspace; the container runs as the non-root user `tutorial`.
FROM python:3.11-slim

# CPU wheels first, from PyTorch's CPU index: requirements.txt then finds torch==2.14.1 satisfied
# (2.14.1+cpu) instead of pulling the default build with several GB of CUDA libraries.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu \
        torch==2.14.1 torchvision==0.29.1

WORKDIR /workspace
COPY requirements.txt pyproject.toml README.md ./
COPY helpers ./helpers
RUN pip install --no-cache-dir -r requirements.txt && pip install --no-cache-dir -e . \
    && pip uninstall --yes rfc3987-syntax  # 2 s per Ray process import: see the Makefile

RUN useradd --create-home --uid 1000 tutorial && chown tutorial /workspace
USER tutorial
EXPOSE 8888
