"""API keys in the OS keyring, not in settings.json: those of remote endpoints, and the key the
tray's own Local API requires.

The ``keyring`` package picks the system's store: Windows Credential Manager, the macOS
Keychain, the Secret Service (GNOME Keyring, KeePassXC) or KWallet. Each key is stored under
the service ``qwen-tray``, an endpoint's as the account ``model:NAME``, the Local API's as
``local-api`` (no model's account can be that). Where no store exists (a bare Linux without a
keyring daemon: keyring's "fail" backend) an endpoint's key stays in settings.json as before
and the user is told once, in one sentence, why and what to install; the Local API's key is
never written to the file: it lasts until the tray quits (app/ui/controllers/local_api.py).

The settings store moves keys here when it saves (app/settings/store.py, also migrating a file
that still has keys in it); the tray reads a key only when it connects to that endpoint.
"""

from __future__ import annotations

import keyring
import keyring.backends.chainer
import keyring.backends.fail
import keyring.backends.null
import keyring.errors

from app.errors import QwenTrayError

SERVICE = "qwen-tray"
NO_BACKEND = ("no system keyring is available ({reason}): a desktop keyring (GNOME Keyring, KWallet, KeePassXC) "
              "or `pip install keyrings.alt` provides one")


# The operating system's own keyrings (keyring's backend modules), named as their users know them.
SYSTEM_KEYRINGS = {
    "keyring.backends.Windows": "Windows Credential Manager", "keyring.backends.macOS": "macOS Keychain",
    "keyring.backends.SecretService": "Secret Service: GNOME Keyring, KeePassXC",
    "keyring.backends.libsecret": "Secret Service: GNOME Keyring, KeePassXC", "keyring.backends.kwallet": "KWallet",
}


class SecretsError(QwenTrayError):
    """The keyring refused to read, store or delete a key (one sentence)."""


LOCAL_API_ACCOUNT = "local-api"
LOCAL_API_KEY = "the Local API's key"  # what the errors call it


def _account(model_name: str) -> str:
    return f"model:{model_name}"


def _model_key(model_name: str) -> str:
    return f"the API key of {model_name!r}"


def backend_name() -> str:
    """The keyring in use, in words ("SecretService Keyring", "Windows WinVaultKeyring", ...)."""
    return keyring.get_keyring().name


def key_store() -> tuple[str, str]:
    """Where keys are kept, for the user: ("system", "macOS Keychain"), ("plain-text file", its path),
    ("encrypted file", its path) (keyrings.alt: a file, not a system keyring) or ("other", the backend's name)."""
    backend = keyring.get_keyring()
    if isinstance(backend, keyring.backends.chainer.ChainerBackend) and backend.backends:
        backend = backend.backends[0]  # the one it stores into first
    system = SYSTEM_KEYRINGS.get(type(backend).__module__)
    if system is not None:
        return "system", system
    path = getattr(backend, "file_path", None)
    if path:
        encrypted = any(cls.__name__ == "Encrypted" for cls in type(backend).__mro__)
        return ("encrypted file" if encrypted else "plain-text file"), str(path)
    return "other", backend.name


def unavailable_reason() -> str | None:
    """Why keys cannot go into a keyring here (one sentence), or None when they can."""
    backend = keyring.get_keyring()
    if isinstance(backend, keyring.backends.fail.Keyring):
        return NO_BACKEND.format(reason="the keyring package found no backend")
    if isinstance(backend, keyring.backends.null.Keyring):
        return NO_BACKEND.format(reason="the keyring package is switched off (null backend)")
    return None


def get_api_key(model_name: str) -> str:
    """The key stored for ``model_name`` ("" when none is)."""
    return _read(_account(model_name), _model_key(model_name))


def set_api_key(model_name: str, key: str) -> None:
    _write(_account(model_name), key, _model_key(model_name))


def delete_api_key(model_name: str) -> None:
    """Forget the key of ``model_name`` (nothing happens when none is stored)."""
    _delete(_account(model_name), _model_key(model_name))


def get_local_api_key() -> str:
    """The key Settings keep for the tray's Local API ("" when none is, or no keyring exists)."""
    return _read(LOCAL_API_ACCOUNT, LOCAL_API_KEY)


def set_local_api_key(key: str) -> None:
    """Keep ``key`` for the Local API; "" forgets it (the API then needs none)."""
    if key:
        _write(LOCAL_API_ACCOUNT, key, LOCAL_API_KEY)
    else:
        _delete(LOCAL_API_ACCOUNT, LOCAL_API_KEY)


def _read(account: str, what: str) -> str:
    if unavailable_reason() is not None:
        return ""
    try:
        return keyring.get_password(SERVICE, account) or ""
    except keyring.errors.KeyringError as e:
        raise SecretsError(f"cannot read {what} from {backend_name()}: {e}") from None


def _write(account: str, key: str, what: str) -> None:
    try:
        keyring.set_password(SERVICE, account, key)
    except keyring.errors.KeyringError as e:
        raise SecretsError(f"cannot store {what} in {backend_name()}: {e}") from None


def _delete(account: str, what: str) -> None:
    if unavailable_reason() is not None:
        return
    try:
        keyring.delete_password(SERVICE, account)
    except keyring.errors.PasswordDeleteError:
        pass  # none was stored
    except keyring.errors.KeyringError as e:
        raise SecretsError(f"cannot delete {what} from {backend_name()}: {e}") from None
