"""Credential values from the environment, and scrubbing them out of any text we log or raise.

Kept free of heavy imports: the S3 layer and the tracker both scrub what they print.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN")
SECRET_NAME_PARTS = ("SECRET", "TOKEN", "PASSWORD", "KEY")
NOT_SECRET = {"true", "false", "none", "null"}
# Words that make a config or param name a credential's. "key" alone is not one: storage.model_key
# names an S3 object and belongs in the record; "key" after one of KEY_QUALIFIERS (access_key, api_key)
# or on its own is.
CREDENTIAL_WORDS = {"secret", "secrets", "token", "password", "passwd", "credential", "credentials",
                    "apikey", "accesskey", "secretkey", "privatekey"}
KEY_QUALIFIERS = {"access", "api", "private", "secret", "signing", "session", "auth", "encryption"}


def _could_be_secret(value: str) -> bool:
    # Flags and numbers (TOKENIZERS_PARALLELISM=false, KEY_TIMEOUT=3000) are settings, not
    # credentials; scrubbing them would mangle every "false" or "3000" in the logs.
    return len(value) >= 4 and value.lower() not in NOT_SECRET and not re.fullmatch(r"[\d.]+", value)


def secret_name(name: str) -> bool:
    """Whether a config/param name holds a credential, by whole words ("tokenizer" is not "token")."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if any(w in CREDENTIAL_WORDS for w in words) or words == ["key"]:
        return True
    return any(w == "key" and i > 0 and words[i - 1] in KEY_QUALIFIERS for i, w in enumerate(words))


def _environment() -> dict[str, str]:
    """A copy of os.environ. Iterating it while another thread (MLflow's telemetry) removes a variable
    raises KeyError between the key and its value: take the copy again."""
    for _ in range(10):
        try:
            return dict(os.environ)
        except (KeyError, RuntimeError):
            continue
    return dict(os.environ)


def hub_token_files(env: dict[str, str]) -> list[Path]:
    """Where ``hf auth login`` keeps the Hugging Face token (huggingface_hub's own order), without importing it."""
    home = Path(os.path.expanduser(env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache",
                                                                        "huggingface")))
    token = Path(os.path.expanduser(env["HF_TOKEN_PATH"])) if env.get("HF_TOKEN_PATH") else home / "token"
    return [token, token.parent / "stored_tokens"]


def _stored_hub_tokens(env: dict[str, str]) -> set[str]:
    values = set()
    for path in hub_token_files(env):
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if path.name == "token":  # the token itself
            values.add(text.strip())
        else:  # stored_tokens: an ini file, a section per token name with its "hf_token = ..." line
            values.update(line.split("=", 1)[1].strip() for line in text.splitlines()
                          if line.split("=", 1)[0].strip() == "hf_token")
    return {v for v in values if _could_be_secret(v)}


def secret_values() -> set[str]:
    """Values of the environment's credentials: AWS keys, any variable named like a secret (HF_TOKEN among
    them), and the Hugging Face token ``hf auth login`` stored."""
    env = _environment()
    return {
        value
        for name, value in env.items()
        if (name in SECRET_ENV or any(part in name.upper() for part in SECRET_NAME_PARTS)) and _could_be_secret(value)
    } | _stored_hub_tokens(env)


def scrub(text: str) -> str:
    """``text`` with every secret value and the password of any ``scheme://user:pass@`` replaced by ***."""
    # Longest first: a secret that contains another must not leave its tail behind.
    for value in sorted(secret_values(), key=len, reverse=True):
        text = text.replace(value, "***")
    return re.sub(r"(\w+://[^/@\s:]+):[^/@\s]+@", r"\1:***@", text)
