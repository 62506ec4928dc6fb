# JupyterLab and the Ray nodes: the repository's locked requirements with CPU-only PyTorch.
# docker compose mounts the repository at /workspace; KubeRay runs the image as it is (the notebooks are
# copied in for its RayJobs). The container runs as the non-root user `tutorial`.
FROM python:3.11-slim

# The locked install (requirements.lock, hashes required) with a CPU-only PyTorch: torch and torchvision at the
# lock's versions from PyTorch's CPU index, and the rest of the lock without the several GB of CUDA libraries
# PyPI's Linux torch pulls in (workshop/install.py, --torch-from). For GPU nodes (deploy/kuberay/overlays/gpu)
# build with
#   --build-arg TORCH_INDEX_URL=
# which installs the whole lock: PyPI's default Linux build of the same versions, CUDA libraries included.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

WORKDIR /workspace
COPY requirements.lock pyproject.toml README.md ./
COPY workshop ./workshop
COPY helpers ./helpers
RUN PIP_NO_CACHE_DIR=1 python -m workshop.install ${TORCH_INDEX_URL:+--torch-from "$TORCH_INDEX_URL"}

# Last, so that editing a notebook does not invalidate the layers above. A RayJob runs them from here with
# papermill (deploy/kuberay/), as the user below (uid 1000), in this folder; compose's bind mount of the
# repository hides this copy.
COPY --chown=1000:1000 notebooks ./notebooks

RUN useradd --create-home --uid 1000 tutorial && chown tutorial /workspace
USER tutorial
EXPOSE 8888
