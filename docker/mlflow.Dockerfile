# MLflow tracking server with the S3 client it needs to proxy artifacts into MinIO, and its basic-auth
# app (`mlflow server --app-name basic-auth`), whose login forms need Flask-WTF (mlflow's `auth` extra).
FROM python:3.11-slim
RUN pip install --no-cache-dir "mlflow[auth]==3.17.2" Flask-WTF==1.3.0 WTForms==3.3.2 boto3==1.44.5
# The basic-auth settings (no secrets: the admin's name and password and the form-signing key come from the
# environment: MLFLOW_AUTH_ADMIN_USERNAME, MLFLOW_AUTH_ADMIN_PASSWORD, MLFLOW_FLASK_SERVER_SECRET_KEY).
COPY docker/mlflow-basic-auth.ini /etc/mlflow/basic_auth.ini
ENV MLFLOW_AUTH_CONFIG_PATH=/etc/mlflow/basic_auth.ini
EXPOSE 5000
