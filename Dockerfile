FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 DJANGO_SETTINGS_MODULE=emailhub.settings
# Production packages only: test and development tools are in requirements-dev.txt, which the
# image never installs (tests/test_deployment.py checks both this file and the two lists).
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
# The admin's styles and the API docs' JavaScript, hashed and compressed into STATIC_ROOT, served
# by WhiteNoise from the web process. collectstatic reads no database.
RUN python manage.py collectstatic --noinput -v0
RUN useradd --create-home emailhub
# Prometheus multiprocess counts of every process (docker-compose.yml shares it as a volume).
RUN install -d -o emailhub /var/lib/emailhub-metrics
USER emailhub
