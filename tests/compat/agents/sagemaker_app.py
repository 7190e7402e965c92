"""A SageMaker multi-turn RL agent in the shape of SageMaker's AgentCore guide: a
``BedrockAgentCoreApp`` entrypoint under ``@sagemaker_rft_handler``, the model at
``metadata.endpoint + "/v1"`` with a bearer token, ``wrap_model`` for the tracking headers, and
``{"reward": ...}``; an error becomes ``{"status": "error"}``."""

import os

from bedrock_agentcore import BedrockAgentCoreApp
from gsm8k_reward import gsm8k_reward
from sagemaker.core.token_generator import generate_token
from sagemaker.train.rft import sagemaker_rft_handler
from sagemaker.train.rft.adapters.strands import wrap_model
from strands import Agent
from strands.models.openai import OpenAIModel
from strands_tools import calculator

app = BedrockAgentCoreApp()


@app.entrypoint
@sagemaker_rft_handler
def handle_rollout(payload):
    metadata = payload.get("metadata", {})
    instance = payload.get("instance", {})
    endpoint = metadata.get("endpoint", os.environ.get("RFT_RUNTIME_ENDPOINT", ""))
    token = generate_token(region=os.environ.get("AWS_REGION", "us-west-2"))
    model = OpenAIModel(
        model_id="default",
        client_args={"api_key": token, "base_url": endpoint + "/v1"},
    )
    model = wrap_model(model)
    agent = Agent(model=model, tools=[calculator])
    try:
        result = agent(instance["prompt"])
    except Exception as exc:
        return {"status": "error", "error": str(exc)}
    text = "".join(block["text"] for block in result.message.get("content", []) if "text" in block)
    return {"reward": gsm8k_reward(text, instance["answer"])}


if __name__ == "__main__":
    app.run()
