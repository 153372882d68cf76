"""Reports over many results: the matrix of tests × provider/dtype (text, markdown) and the HTML report.
They read typed result rows; they run nothing."""
