"""Icons drawn with QPainter: the app mark plus a state badge (no image files needed at run time).

ready = green, busy = blue, loading = amber with a progress arc, error = red, empty = grey.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap

BRAND = QColor("#4f46e5")
STATE_COLORS = {
    "empty": QColor("#9ca3af"), "loading": QColor("#f59e0b"), "ready": QColor("#22c55e"),
    "busy": QColor("#3b82f6"), "error": QColor("#ef4444"),
}


def _draw_mark(p: QPainter, size: float) -> None:
    """A rounded square with a white "Q" made of a ring and a tail."""
    p.setPen(Qt.NoPen)
    p.setBrush(BRAND)
    p.drawRoundedRect(QRectF(0, 0, size, size), size * 0.22, size * 0.22)
    pen = QPen(QColor("white"), size * 0.11, Qt.SolidLine, Qt.RoundCap)
    p.setPen(pen)
    p.setBrush(Qt.NoBrush)
    ring = QRectF(size * 0.22, size * 0.2, size * 0.52, size * 0.52)
    p.drawEllipse(ring)
    p.drawLine(QPointF(size * 0.56, size * 0.6), QPointF(size * 0.76, size * 0.8))


def draw_icon(state: str | None, size: int = 64, progress: float | None = None) -> QPixmap:
    """The mark with a badge for ``state`` (None: no badge); ``progress`` 0..1 draws an arc."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.transparent)
    p = QPainter(pixmap)
    p.setRenderHint(QPainter.Antialiasing)
    _draw_mark(p, size)
    if state is not None:
        r = size * 0.2
        centre = QPointF(size - r - 1, size - r - 1)
        p.setPen(QPen(QColor("white"), size * 0.05))
        p.setBrush(QBrush(STATE_COLORS.get(state, STATE_COLORS["empty"])))
        p.drawEllipse(centre, r, r)
        if state == "loading" and progress is not None:
            arc = QPainterPath()
            box = QRectF(centre.x() - r, centre.y() - r, 2 * r, 2 * r)
            arc.moveTo(centre)
            arc.arcTo(box, 90, -360 * max(0.0, min(1.0, progress)))
            arc.closeSubpath()
            p.setPen(Qt.NoPen)
            p.setBrush(QColor("#b45309"))
            p.drawPath(arc)
    p.end()
    return pixmap


def state_icon(state: str, progress: float | None = None) -> QIcon:
    icon = QIcon()
    for size in (16, 24, 32, 64):
        icon.addPixmap(draw_icon(state, size, progress))
    return icon


def app_icon() -> QIcon:
    icon = QIcon()
    for size in (16, 24, 32, 48, 64, 128, 256):
        icon.addPixmap(draw_icon(None, size))
    return icon
