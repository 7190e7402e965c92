"""A SageMaker multi-turn RL agent in the shape of SageMaker's custom-agent guide: a FastAPI
server with ``POST /rollout`` and ``GET /health``, ``@sagemaker_rft_handler`` reporting the
reward, the inference headers and a bearer token on a plain OpenAI client."""

import os

import openai
from fastapi import FastAPI
from gsm8k_reward import gsm8k_reward
from sagemaker.core.token_generator import generate_token
from sagemaker.train.rft import sagemaker_rft_handler
from sagemaker.train.rft.headers import make_inference_headers

app = FastAPI()


@app.post("/rollout")
def rollout_endpoint(payload: dict):
    handle_rollout(payload)
    return {"status": "accepted"}


@sagemaker_rft_handler
def handle_rollout(payload):
    instance = payload.get("instance", {})
    metadata = payload.get("metadata", {})
    inference_params = payload.get("inferenceParams", {})
    endpoint = metadata.get("endpoint", os.environ.get("RFT_RUNTIME_ENDPOINT", ""))
    headers = make_inference_headers(metadata)
    token = generate_token(region=os.environ.get("AWS_REGION", "us-west-2"))
    result = run_agent(instance["prompt"], token, endpoint, inference_params, headers)
    return {"reward": gsm8k_reward(result, instance["answer"])}


def run_agent(prompt: str, token: str, endpoint: str, inference_params: dict, headers: dict) -> str:
    client = openai.OpenAI(base_url=endpoint + "/v1", api_key=token, default_headers=headers)
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=inference_params.get("max_tokens", 256),
        temperature=inference_params.get("temperature", 1.0),
        top_p=inference_params.get("top_p", 1.0),
    )
    return response.choices[0].message.content


@app.get("/health")
def health():
    return {"status": "ok"}
