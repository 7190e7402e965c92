"""A gen-1 agentcore-rl-toolkit agent in the shape of the toolkit's Strands math example:
``AgentCoreRLApp`` + ``@app.rollout_entrypoint``, the settings from ``payload["_rollout"]``, a
Strands agent with the calculator tool, ``{"rewards": ...}``."""

from agentcore_rl_toolkit import AgentCoreRLApp
from gsm8k_reward import gsm8k_reward
from strands import Agent
from strands.models.openai import OpenAIModel
from strands_tools import calculator

app = AgentCoreRLApp()

system_prompt = (
    "Your task is to solve the math problem. "
    "Use the calculator tool to compute all mathematical expressions. "
    'Think step by step and output the final answer after "####".'
)


@app.rollout_entrypoint
def invoke_agent(payload: dict):
    base_url = payload["_rollout"]["base_url"]
    model_id = payload["_rollout"]["model_id"]
    params = payload["_rollout"].get("sampling_params", {})

    model = OpenAIModel(
        client_args={"api_key": "EMPTY", "base_url": base_url},
        model_id=model_id,
        params=params,
    )
    agent = Agent(model=model, tools=[calculator], system_prompt=system_prompt)

    response = agent(payload.get("prompt"))
    rewards = gsm8k_reward(response.message["content"][0]["text"], payload.get("answer"))
    return {"rewards": rewards}


if __name__ == "__main__":
    app.run()
