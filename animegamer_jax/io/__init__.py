"""Files the way a user names them, local or a URL (``gs://`` included): paths, file operations, media."""
