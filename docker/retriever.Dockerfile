# The retriever service: FastAPI over Qdrant (QDRANT_URL), trainable query tower.
ARG BASE_IMAGE=bridge-base
FROM ${BASE_IMAGE}
EXPOSE 8001
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8001/readyz')"
CMD ["bridge-rl", "serve", "retriever", "--host", "0.0.0.0", "--port", "8001"]
