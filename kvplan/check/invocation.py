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
from dataclasses import replace

from kvplan.records import dataclass

_K8S_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_SHELL_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
# Redirections (`2>&1`, `> /tmp/log`, `< in`) name no engine argument; they are dropped before splitting.
_REDIRECT_RE = re.compile(r"(?<!\S)\d*(?:>>?|<)(?:&\d+|\s*[^\s;&|]+)")
_UNEXPANDED_RE = re.compile(r"\$(?:\([A-Za-z_]\w*\)|\{[A-Za-z_]\w*[^}]*\}|[A-Za-z_]\w*)")
_SHELLS = {"sh", "bash", "ash", "dash", "zsh"}
_SEPARATORS = {";", "&&", "||", "|", "&", "\n", ";;"}
# Words that may stand before a command: wrappers that run it, and shell keywords (`then vllm serve ...`).
_WRAPPERS = {"exec", "nohup", "time", "env", "command", "then", "do", "else", "{", "(", "!"}
_PYTHON_RE = re.compile(r"^python[0-9.]*$")
_VLLM_MODULES = {"vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"}
# Modules that start an engine with that engine's own flags: NVIDIA Dynamo's workers wrap vLLM and SGLang.
_MODULE_ENGINES = {
    "sglang.launch_server": "sglang",
    "dynamo.vllm": "vllm",
    "dynamo.sglang": "sglang",
    "dynamo.sglang.worker": "sglang",
}
_VERSION_RE = re.compile(r"(?:^|[^0-9])v?(\d+)\.(\d+)(?:\.(\d+))?")
_DLC_VERSION_RE = re.compile(r"-(?:cu\d+|rocm\d+)\.(\d+)-(\d+)(?:-(\d+))?\.")  # GCP: ...-cu124.2-3.ubuntu2204


# `pip install ... vllm==0.10.1 ...` / `uv pip install "vllm[flashinfer]"`: a command of a script, up to the next
# separator, and a requirement word naming vLLM with its extras and pinned release.
_PIP_RE = re.compile(r"\b(?:uv\s+)?pip3?\s+install\b([^\n;&|]*)")
_VLLM_REQ_RE = re.compile(r"""^['"]?vllm(?:\[([^\]]*)\])?(?:==([0-9][\w.+-]*))?['"]?$""")


@dataclass(frozen=True)
class PipVllm:
    """vLLM pip-installed by the file's own script: the vllm wheel, at the pinned release if any."""

    version: str | None
    extras: tuple[str, ...] = ()

    @property
    def install(self) -> str | None:
        """kvplan's --vllm-install for it: "wheel", or None where the `flashinfer` extra adds what the image has
        (its sampler), though not OpenAI's triton_kernels: neither install describes it."""
        return None if "flashinfer" in self.extras else "wheel"


def pip_vllm(script: str) -> PipVllm | None:
    """The vLLM a shell script installs with pip or uv, if it installs one."""
    for command in _PIP_RE.finditer(script):
        for word in command.group(1).split():
            found = _VLLM_REQ_RE.match(word)
            if found:
                extras = tuple(e.strip() for e in (found.group(1) or "").split(",") if e.strip())
                return PipVllm(found.group(2), extras)
    return None


@dataclass(frozen=True)
class Invocation:
    """The engine a container runs and the words after its program name."""

    engine: str
    argv: tuple[str, ...]
    how: str  # how it was recognised, for notes: "vllm serve", "image vllm/vllm-openai", ...
    positional_model: bool  # whether the first positional is the model (`vllm serve MODEL`)
    argv_lines: tuple[int | None, ...] = ()  # the file line of each word of argv, when known
    notes: tuple[str, ...] = ()
    pip: PipVllm | None = None  # the container's own script pip-installs vLLM


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
    script = _REDIRECT_RE.sub(" ", script)
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
    command: Sequence[str],
    args: Sequence[str],
    image: str | None,
    env: Mapping[str, str],
    *,
    command_lines: Sequence[int | None] = (),
    args_lines: Sequence[int | None] = (),
) -> Invocation | None:
    """The engine invocation a container runs, or None when it runs no engine kvplan knows.

    `command_lines` / `args_lines` give the file line of each word, so flags can be reported at their line.
    """
    command = [expand_k8s(str(w), env) for w in command]
    args = [expand_k8s(str(w), env) for w in args]
    words = command + args
    found = _find(words, command, args, image, env, command_lines, args_lines)
    pip = pip_vllm("\n".join(words))
    return replace(found, pip=pip) if found is not None and pip is not None else found


def _find(
    words: list[str], command: list[str], args: list[str], image: str | None, env: Mapping[str, str],
    command_lines: Sequence[int | None], args_lines: Sequence[int | None],
) -> Invocation | None:
    lines = _pad(command_lines, len(command)) + _pad(args_lines, len(args))
    if command:
        return _from_words(words, lines, env)
    arg_lines = lines[len(command):]
    image_engine = engine_of_image(image)
    if image_engine == "vllm":
        # The vllm/vllm-openai entrypoint is `vllm serve` (older tags: the api_server module); args are its flags.
        notes: tuple[str, ...] = ()
        for prefix in (["vllm", "serve"], ["serve"]):
            if args[: len(prefix)] == prefix:
                # `args: ["serve", MODEL]` repeats the entrypoint; read as written, the model would be "serve".
                args, arg_lines = args[len(prefix) :], arg_lines[len(prefix) :]
                notes = (f"dropped '{' '.join(prefix)}' from args: the image's entrypoint already runs vllm serve",)
                break
        return Invocation("vllm", tuple(args), f"image {image} with args", True, tuple(arg_lines), notes)
    if image_engine == "tgi":
        return Invocation("tgi", tuple(args), f"image {image}", False, tuple(arg_lines))
    return _from_words(args, arg_lines, env) if args else None


def image_version(image: str | None) -> str | None:
    """The engine version an image tag names: 'vllm/vllm-openai:v0.10.1' -> '0.10.1'; None for 'latest'.

    Google's deep-learning containers put it in the name: '...-inference-cu124.2-3.ubuntu2204' -> '2.3'.
    """
    if not image:
        return None
    repo = image.split("@")[0]
    dlc = _DLC_VERSION_RE.search(repo)
    if dlc:
        return ".".join(part for part in dlc.groups() if part is not None)
    tag = repo.rsplit("/", 1)[-1].partition(":")[2]
    match = _VERSION_RE.search(tag)
    if not match:
        return None
    return ".".join(part for part in match.groups() if part is not None)


def _pad(lines: Sequence[int | None], count: int) -> list[int | None]:
    return (list(lines) + [None] * count)[:count]


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


def _from_words(words: list[str], lines: list[int | None], env: Mapping[str, str]) -> Invocation | None:
    if not words:
        return None
    program = os.path.basename(words[0])
    if program in _SHELLS:
        at = _script_index(words[1:])
        if at is None:
            return None
        script, base = words[1 + at], lines[1 + at]
        for simple in shell_commands(script, env):
            found = _from_simple(simple, [None] * len(simple))
            if found is not None:
                located = script_lines(script, found.argv, base)
                return Invocation(found.engine, found.argv, found.how, found.positional_model, tuple(located))
        return None
    return _from_simple(words, lines)


def script_lines(script: str, words: Sequence[str], base: int | None) -> list[int | None]:
    """The file line of each flag of `words` inside a script that starts at line `base` of the file.

    A script holding newlines came from a block scalar (`- |`), whose text starts on the line after the
    indicator; one without came from a single line. Flags are found in order in the text, so
    `--max-model-len 4096` on the fourth line of the block reports line base + 4.
    """
    if base is None:
        return [None] * len(words)
    first = base + 1 if "\n" in script else base
    located: list[int | None] = []
    at = 0
    for word in words:
        key = word.split("=", 1)[0]
        found = script.find(key, at) if key.startswith("-") else -1
        if found < 0:
            located.append(located[-1] if located else first)
            continue
        at = found + len(key)
        located.append(first + script.count("\n", 0, found))
    return located


def _script_index(shell_args: list[str]) -> int | None:
    """Where the script of `sh -c SCRIPT` / `bash -ec SCRIPT` is in the shell's arguments; None for `sh x.sh`."""
    for i, word in enumerate(shell_args):
        if word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
            return i + 1 if i + 1 < len(shell_args) else None
        if not word.startswith("-"):
            return None
    return None


def _from_simple(words: list[str], lines: list[int | None]) -> Invocation | None:
    """Recognise one simple command: vllm serve, python -m vllm/sglang/dynamo modules, text-generation-launcher."""
    i = 0
    while i < len(words) and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]) or words[i] in _WRAPPERS):
        i += 1
    words, lines = words[i:], lines[i:]
    if not words:
        return None
    program = os.path.basename(words[0])
    if program == "vllm" and len(words) > 1 and words[1] == "serve":
        return Invocation("vllm", tuple(words[2:]), "vllm serve", True, tuple(lines[2:]))
    if program == "text-generation-launcher":
        return Invocation("tgi", tuple(words[1:]), "text-generation-launcher", False, tuple(lines[1:]))
    if _PYTHON_RE.match(program):
        j = 1
        while j < len(words) and words[j].startswith("-") and words[j] != "-m":
            j += 1
        if j + 1 < len(words) and words[j] == "-m":
            module, rest, rest_lines = words[j + 1], words[j + 2 :], lines[j + 2 :]
            if module in _VLLM_MODULES:
                return Invocation("vllm", tuple(rest), f"python -m {module}", False, tuple(rest_lines))
            if module == "vllm.entrypoints.cli.main" and rest[:1] == ["serve"]:
                return Invocation("vllm", tuple(rest[1:]), "vllm serve", True, tuple(rest_lines[1:]))
            if module in _MODULE_ENGINES:
                return Invocation(_MODULE_ENGINES[module], tuple(rest), f"python -m {module}", False,
                                  tuple(rest_lines))
    return None
