"""Reports over many results: the matrix of tests × provider/dtype (text, markdown), the HTML report, and which
files a report may be written over. They read typed result rows; they run nothing."""
