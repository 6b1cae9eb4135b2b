"""Guess the digit, as an OpenEnv environment: typed Action / Observation, an Environment whose
``reset`` and ``step`` run on the server, and the FastAPI app ``create_app`` makes (each WebSocket
session holds its own environment). Copy this file to start your own.

    PYTHONPATH=examples/envs posttrain rl examples/grpo_openenv_guess.yaml

posttrain starts ``uvicorn guess_openenv:app`` on 127.0.0.1 (``env.options.launch``), opens one
session per episode, sends the model's turn as ``GuessAction.guess`` and shows it
``GuessObservation.feedback``; the episode is PASS when it ends with reward 1.
"""

import uuid

from openenv.core.env_server import Action, Environment, Observation, State, create_app


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str = ""


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # posttrain runs a step's episodes at once
    MAX_GUESSES = 3

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self.secret = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        # the record's "seed" (env.options.reset_fields) picks the secret: the same task every time
        self.secret = (7 * (seed or 0) + 3) % 10
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return GuessObservation(feedback="Guess a digit from 0 to 9. Answer with the digit only.")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        text = action.guess.strip()
        if text == str(self.secret):
            return GuessObservation(feedback="right", done=True, reward=1.0)
        if self._state.step_count >= self.MAX_GUESSES:
            return GuessObservation(feedback="out of guesses", done=True, reward=0.0)
        if text not in [str(d) for d in range(10)]:
            return GuessObservation(feedback="not a digit", reward=0.0)
        return GuessObservation(feedback="higher" if int(text) < self.secret else "lower", reward=0.0)

    @property
    def state(self):
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
