# MLflow tracking server with the S3 client it needs to proxy artifacts into MinIO.
FROM python:3.11-slim
RUN pip install --no-cache-dir mlflow==3.17.2 boto3==1.44.5
EXPOSE 5000
