# JupyterLab and the Ray nodes: the repository's pinned requirements with CPU-only PyTorch.
# docker compose mounts the repository at /workspace; KubeRay runs the image as it is (the notebooks are
# copied in for its RayJobs). The container runs as the non-root user `tutorial`.
FROM python:3.11-slim

# CPU wheels first, from PyTorch's CPU index: requirements.txt then finds torch==2.14.1 satisfied
# (2.14.1+cpu) instead of pulling the default build with several GB of CUDA libraries.
# For GPU nodes (deploy/kuberay/overlays/gpu) build with
#   --build-arg TORCH_INDEX_URL=https://pypi.org/simple
# which installs PyPI's default Linux build of the same versions, CUDA libraries included.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
        torch==2.14.1 torchvision==0.29.1

WORKDIR /workspace
COPY requirements.txt pyproject.toml README.md ./
COPY helpers ./helpers
RUN pip install --no-cache-dir -r requirements.txt && pip install --no-cache-dir -e . \
    && pip uninstall --yes rfc3987-syntax  # 2 s per Ray process import: see the Makefile

# Last, so that editing a notebook does not invalidate the layers above. A RayJob runs them from here with
# papermill (deploy/kuberay/), as the user below (uid 1000), in this folder; compose's bind mount of the
# repository hides this copy.
COPY --chown=1000:1000 notebooks ./notebooks

RUN useradd --create-home --uid 1000 tutorial && chown tutorial /workspace
USER tutorial
EXPOSE 8888
