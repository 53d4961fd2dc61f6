"""Simplified Chinese UI text, keyed by the English original (see app/ui/i18n.py)."""

ZH_CN: dict[str, str] = {
}
