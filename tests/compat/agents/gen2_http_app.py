"""A gen-2 agentcore-rl-toolkit agent in the shape of the toolkit's HTTP example:
``AgentCoreRuntimeApp`` + ``@app.entrypoint``, the trainer's settings in ``payload["_config"]``,
a pydantic request model, ``{"reward": ...}``."""

from agentcore_rl_toolkit import AgentCoreRuntimeApp
from gsm8k_reward import gsm8k_reward
from pydantic import BaseModel
from strands import Agent
from strands.models.openai import OpenAIModel
from strands_tools import calculator

app = AgentCoreRuntimeApp()


class InvocationRequest(BaseModel):
    prompt: str
    answer: str | None = None


system_prompt = (
    "Your task is to solve the math problem. "
    "Use the calculator tool to compute all mathematical expressions. "
    'Think step by step and output the final answer after "####".'
)


@app.entrypoint
def invoke_agent(payload: dict, context):
    request = InvocationRequest(**payload)
    config = payload["_config"]
    model = OpenAIModel(
        client_args={"api_key": config.get("api_key") or "EMPTY", "base_url": config["base_url"]},
        model_id=config["model_id"],
        params=config.get("sampling_params", {}),
    )
    agent = Agent(model=model, tools=[calculator], system_prompt=system_prompt)
    response = agent(request.prompt)
    text = "".join(
        block["text"] for block in response.message.get("content", []) if "text" in block
    )
    return {"reward": gsm8k_reward(text, request.answer)}


if __name__ == "__main__":
    app.run()
