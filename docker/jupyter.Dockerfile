# JupyterLab with the repository's pinned requirements; the repo is mounted at /workspace.
FROM python:3.11-slim
WORKDIR /workspace
COPY requirements.txt pyproject.toml README.md ./
COPY helpers ./helpers
RUN pip install --no-cache-dir -r requirements.txt && pip install --no-cache-dir -e .
EXPOSE 8888
