"""The Wordle agent with the plain OpenAI client.

The code lives in core, :mod:`rollwire.envs.wordle.agent_openai`, so that ``rollwire demo`` runs from
an installed wheel; read it there. In short::

    app = RolloutApp(failure_reward=-1.5)

    @app.rollout_entrypoint
    def play(payload):
        game = WordleGame(payload["secret"])
        client = openai_client(payload)          # the rollout session, or production
        messages = [system, user]
        while not game.over:
            create = rollout_create_kwargs(payload, model="gpt-4o-mini")  # session model + sampling
            msg = client.chat.completions.create(messages=messages, tools=[GUESS_TOOL], **create).choices[0].message
            ... run each guess_word call, append the tool results ...
        return {"reward": score_game(game).reward, "metrics": ...}

Serve it on AgentCore's contract (port 8080) with ``python examples/wordle/agent_openai.py``.
"""

from rollwire.envs.wordle.agent_openai import app, play, secret_of

__all__ = ["app", "play", "secret_of"]

if __name__ == "__main__":
    app.run()
