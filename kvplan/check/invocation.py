"""Find the engine command line inside a container's command, args, shell script and image.

Nothing is executed: `sh -c "a; python3 -m vllm... --tp 8"` is split the way a shell would split it, `$(VAR)`
is replaced from the container's env as Kubernetes does before the process starts, `$VAR` / `${VAR}` as the
shell would, and a variable the manifest does not define is left as written (the field that needs it then
becomes unresolved).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_K8S_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_SHELL_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_UNEXPANDED_RE = re.compile(r"\$(?:\([A-Za-z_]\w*\)|\{[A-Za-z_]\w*[^}]*\}|[A-Za-z_]\w*)")
_SHELLS = {"sh", "bash", "ash", "dash", "zsh"}
_SEPARATORS = {";", "&&", "||", "|", "&", "\n", ";;"}
_WRAPPERS = {"exec", "nohup", "time", "env", "command"}
_PYTHON_RE = re.compile(r"^python[0-9.]*$")
_VLLM_MODULES = {"vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"}


@dataclass(frozen=True)
class Invocation:
    """The engine a container runs and the words after its program name."""

    engine: str
    argv: tuple[str, ...]
    how: str  # how it was recognised, for notes: "vllm serve", "image vllm/vllm-openai", ...
    positional_model: bool  # whether the first positional is the model (`vllm serve MODEL`)


def expand_k8s(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command/args: defined variables replaced, `$$` escapes a dollar."""

    def _sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _K8S_VAR_RE.sub(_sub, text)


def expand_shell(text: str, env: Mapping[str, str]) -> str:
    """The shell's $VAR, ${VAR} and ${VAR:-default} from the container env; unknown ones stay as written."""

    def _sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if name in env:
            return env[name]
        if match.group(2) is not None:
            return match.group(2)
        return match.group(0)

    return _SHELL_VAR_RE.sub(_sub, text)


def unexpanded(text: str) -> str | None:
    """The variable reference still left in `text` (`$(LWS_GROUP_SIZE)`, `${bucket}`), if any."""
    match = _UNEXPANDED_RE.search(text)
    return match.group(0) if match else None


def shell_commands(script: str, env: Mapping[str, str]) -> list[list[str]]:
    """Split a `sh -c` script into simple commands (on ; && || | & and newlines), words shell-unquoted."""
    script = script.replace("\\\r\n", " ").replace("\\\n", " ")
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in _SEPARATORS or set(token) <= set(";&|\n"):
                commands.append([])
            else:
                commands[-1].append(expand_shell(token, env))
    except ValueError:
        # An unbalanced quote: fall back to plain whitespace splitting of what is there.
        commands = [[expand_shell(w, env) for w in line.split()] for line in re.split(r"[;\n]|&&|\|\|", script)]
    return [c for c in commands if c]


def find_invocation(
    command: Sequence[str], args: Sequence[str], image: str | None, env: Mapping[str, str]
) -> Invocation | None:
    """The engine invocation a container runs, or None when it runs no engine kvplan knows."""
    command = [expand_k8s(str(w), env) for w in command]
    args = [expand_k8s(str(w), env) for w in args]
    words = command + args
    if command:
        return _from_words(words, env)
    image_engine = engine_of_image(image)
    if image_engine == "vllm":
        # The vllm/vllm-openai entrypoint is `vllm serve` (older tags: the api_server module); args are its flags.
        return Invocation("vllm", tuple(args), f"image {image} with args", True)
    if image_engine == "tgi":
        return Invocation("tgi", tuple(args), f"image {image}", False)
    return _from_words(args, env) if args else None


def engine_of_image(image: str | None) -> str | None:
    """'vllm' for the vLLM OpenAI images, 'tgi' for text-generation-inference images, else None."""
    if not image:
        return None
    repo = image.split("@")[0]
    last = repo.rsplit("/", 1)[-1].split(":")[0]
    if last == "vllm-openai" or last.startswith("vllm-openai-"):
        return "vllm"
    if "text-generation-inference" in last:
        return "tgi"
    return None


def _from_words(words: list[str], env: Mapping[str, str]) -> Invocation | None:
    if not words:
        return None
    program = os.path.basename(words[0])
    if program in _SHELLS:
        script = _script_of(words[1:])
        if script is None:
            return None
        for simple in shell_commands(script, env):
            found = _from_simple(simple)
            if found is not None:
                return found
        return None
    return _from_simple(words)


def _script_of(shell_args: list[str]) -> str | None:
    """The script of `sh -c SCRIPT` / `bash -ec SCRIPT`; None for `sh script.sh`."""
    for i, word in enumerate(shell_args):
        if word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
            return shell_args[i + 1] if i + 1 < len(shell_args) else None
        if not word.startswith("-"):
            return None
    return None


def _from_simple(words: list[str]) -> Invocation | None:
    """Recognise one simple command: vllm serve, python -m vllm/sglang modules, text-generation-launcher."""
    i = 0
    while i < len(words) and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]) or words[i] in _WRAPPERS):
        i += 1
    words = words[i:]
    if not words:
        return None
    program = os.path.basename(words[0])
    if program == "vllm" and len(words) > 1 and words[1] == "serve":
        return Invocation("vllm", tuple(words[2:]), "vllm serve", True)
    if program == "text-generation-launcher":
        return Invocation("tgi", tuple(words[1:]), "text-generation-launcher", False)
    if _PYTHON_RE.match(program):
        j = 1
        while j < len(words) and words[j].startswith("-") and words[j] != "-m":
            j += 1
        if j + 1 < len(words) and words[j] == "-m":
            module, rest = words[j + 1], words[j + 2 :]
            if module in _VLLM_MODULES:
                return Invocation("vllm", tuple(rest), f"python -m {module}", False)
            if module == "vllm.entrypoints.cli.main" and rest[:1] == ["serve"]:
                return Invocation("vllm", tuple(rest[1:]), "vllm serve", True)
            if module == "sglang.launch_server":
                return Invocation("sglang", tuple(rest), "python -m sglang.launch_server", False)
    return None
