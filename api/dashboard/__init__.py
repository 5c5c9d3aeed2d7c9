"""The failure dashboard: server-rendered pages over the public query endpoints.

`router` carries the pages under /dashboard, their static files, and the analysis endpoints
(api.routes.analysis) the pages read.
"""
from api.dashboard.routes import router

__all__ = ["router"]
