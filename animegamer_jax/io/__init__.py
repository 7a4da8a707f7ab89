"""Files the way a user names them, local or a URL (gs:// included), bottom to top:

  paths.py    user paths as URLs (etils.epath), repository-relative lookup, the storage emulator
  fileio.py   operations on users' folders and checkpoints: atomic writes, owner stamps, hashing
  media.py    pixels and media files: value ranges, MP4 / GIF / PNG writers, reading a video
"""
